"""Preference pairs from a model's own samples: k completions per prompt from the generation engine, each scored
by the reward function (the task's verifier, or `reward.fn` in its sandboxed process, as in RL and eval); a prompt
whose samples hold a correct one (score >= 1) and a wrong one gives the pair (first correct, first wrong), in
sample order. Prompts whose samples are all right or all wrong give none - they carry no preference.

Writes a dataset folder like data prep's (`train.jsonl`, `eval.jsonl`, `info.json`, staged and renamed so a
failure leaves nothing half-written): train pairs from the train split's prompts, eval pairs from the eval
split's (held-out pairs, e.g. for a reward model's pairwise accuracy). Rows are preference examples
(`posttrain.data.examples`): the prompt turns, chosen/rejected as one assistant turn each, answer and columns kept.

Leaves out: choosing pairs by score gap or by length, more than one pair per prompt, ties broken by a judge.

    info = make_pairs(model_dir, dataset_dir, PairsConfig(...), RewardConfig(), out_dir)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from posttrain.config import EvalConfig, PairsConfig, RewardConfig
from posttrain.data.chat import encode_prompt
from posttrain.data.examples import prompt_messages, read_examples, write_dataset
from posttrain.models.io import load_tokenizer
from posttrain.rewards import RewardSample, RewardScorer


@dataclass(frozen=True, kw_only=True)
class PairsInfo:
    num_train: int
    """Train pairs (train prompts with a correct and a wrong sample)."""
    num_eval: int
    """Held-out pairs from the eval split's prompts."""
    train_prompts: int
    """Train prompts sampled."""
    eval_prompts: int
    all_correct: int
    """Prompts (both splits) whose samples were all correct: no pair."""
    all_wrong: int
    """Prompts (both splits) whose samples were all wrong: no pair."""
    reward_failures: int
    """Reward calls that failed (counted as wrong), over both splits."""
    samples_per_prompt: int
    generated_tokens: int


def sample_and_score(rows: list[dict], gen, tok, scorer: RewardScorer, *, n: int, temperature: float) -> tuple:
    """n samples of each row's prompt (its own chat template) from `gen` (eval.evaluate.generator), decoded and
    scored: (generations, texts, results), the n of row i at [i * n, (i + 1) * n)."""
    prompts = [encode_prompt(tok, prompt_messages(ex)) for ex in rows]
    samples = gen(prompts, temperature=temperature, n=n, on_batch=lambda done, total: None)
    texts = [tok.decode(g.response_ids, skip_special_tokens=True) for g in samples]
    return samples, texts, scorer.score([RewardSample.from_example(rows[i // n], t) for i, t in enumerate(texts)])


def _pairs_for(rows: list[dict], gen, tok, scorer: RewardScorer, cfg: PairsConfig) -> tuple[list[dict], dict]:
    k = cfg.samples_per_prompt
    samples, texts, results = sample_and_score(rows, gen, tok, scorer, n=k, temperature=cfg.temperature)
    pairs, counts = [], {"all_correct": 0, "all_wrong": 0,
                         "reward_failures": sum(r.failure is not None for r in results),
                         "generated_tokens": sum(len(g.response_ids) for g in samples)}
    for i, ex in enumerate(rows):
        group = list(zip(texts[i * k:(i + 1) * k], results[i * k:(i + 1) * k]))
        right = [t for t, r in group if r.failure is None and r.score >= 1.0]
        wrong = [t for t, r in group if not (r.failure is None and r.score >= 1.0)]
        if not wrong:
            counts["all_correct"] += 1
        elif not right:
            counts["all_wrong"] += 1
        else:
            pairs.append({"messages": prompt_messages(ex), "chosen": [{"role": "assistant", "content": right[0]}],
                          "rejected": [{"role": "assistant", "content": wrong[0]}], "answer": ex.get("answer"),
                          "task": ex.get("task"), "columns": ex.get("columns") or {}})
    return pairs, counts


def make_pairs(model_dir: str | Path, dataset_dir: str | Path, cfg: PairsConfig, reward: RewardConfig,
               out_dir: str | Path, *, device: str = "cpu") -> PairsInfo:
    """Sample, score and pair the dataset's train and eval prompts with the model in `model_dir`; write the pairs
    dataset into `out_dir` (which must not exist or be empty). Refuses a result without a single train pair."""
    from posttrain.eval.evaluate import generator

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"pairs output folder {out_dir} is not empty")
    splits = {"train": read_examples(dataset_dir, "train"), "eval": read_examples(dataset_dir, "eval")}
    limits = {"train": cfg.max_prompts, "eval": cfg.eval_prompts}
    splits = {s: [ex for ex in rows if ex.get("answer") is not None or reward.fn][:limits[s] or None]
              for s, rows in splits.items()}
    if not splits["train"]:
        raise ValueError(f"{dataset_dir}: no train prompts to sample pairs from (rows need a reference answer for "
                         "the built-in verifier, or set reward.fn)")
    tok = load_tokenizer(model_dir)
    gen_cfg = EvalConfig(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                         max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, seed=cfg.seed,
                         backend=cfg.backend)
    gen = generator(model_dir, tok, gen_cfg, device)

    written, totals = {}, {"all_correct": 0, "all_wrong": 0, "reward_failures": 0, "generated_tokens": 0}
    with RewardScorer(reward) as scorer:
        scorer.check_arguments({c for rows in splits.values() for ex in rows for c in (ex.get("columns") or {})})
        for split, rows in splits.items():
            written[split], counts = _pairs_for(rows, gen, tok, scorer, cfg) if rows else ([], {})
            for key, v in counts.items():
                totals[key] += v
            print(f"pairs: {split}: {len(written[split])} pairs from {len(rows)} prompts x {cfg.samples_per_prompt} "
                  f"samples", flush=True)
    if not written["train"]:
        raise ValueError(f"pairs: the model's {cfg.samples_per_prompt} samples of every train prompt were all "
                         f"right ({totals['all_correct']} prompts) or all wrong ({totals['all_wrong']}): no pair to "
                         "train on; raise pairs.samples_per_prompt or pairs.temperature")
    info = PairsInfo(num_train=len(written["train"]), num_eval=len(written["eval"]),
                     train_prompts=len(splits["train"]), eval_prompts=len(splits["eval"]),
                     samples_per_prompt=cfg.samples_per_prompt, **totals)
    write_dataset(out_dir, written["train"], written["eval"],
                  {"schema": "preference", "source": "model samples", **asdict(info)})
    return info
