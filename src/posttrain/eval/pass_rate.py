"""Prompt selection by pass rate (`data.pass_rate`): a model samples k answers to each train prompt, the reward
function or verifier scores them (score >= 1 passes, as RL's accuracy counts), and only the prompts whose pass
rate lies strictly between `min_rate` and `max_rate` are kept - by default the ones the model neither always
nor never solves, whose GRPO groups have a reward spread and so a gradient.

Writes a dataset folder like data prep's (`train.jsonl`: the kept rows as they were, in their order;
`eval.jsonl`: the eval split whole; `info.json`: the source's info plus the counts and every sampled prompt's
rate as [train row, rate]; with `refresh_every` > 0 also `pool.jsonl`, every sampled row in that order, which
the RL run's curriculum re-measures: posttrain.rl.curriculum), staged and renamed so a failure leaves nothing
half-written. Sampling uses RL's
settings (temperature, top-p, top-k, max_new_tokens), so a rate is what the first RL step would see.

    info = select_by_pass_rate(model_dir, dataset_dir, PassRateConfig(enabled=True), rl_cfg, RewardConfig(), out)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from posttrain.config import EvalConfig, PassRateConfig, RewardConfig, RLConfig
from posttrain.data.examples import read_examples, write_dataset
from posttrain.eval.pairs import sample_and_score
from posttrain.models.io import load_tokenizer
from posttrain.rewards import RewardScorer


@dataclass(frozen=True, kw_only=True)
class PassRateInfo:
    sampled: int
    """Train prompts sampled."""
    kept: int
    """Prompts kept: min_rate < rate < max_rate."""
    never_solved: int
    """Sampled prompts with rate 0."""
    always_solved: int
    """Sampled prompts with rate 1."""
    mean_rate: float
    """Mean pass rate over the sampled prompts."""
    reward_failures: int
    """Reward calls that failed (counted as not passing)."""
    samples_per_prompt: int
    generated_tokens: int


def pass_rates(rows: list[dict], model_dir: str | Path, cfg: PassRateConfig, rl: RLConfig, reward: RewardConfig,
               *, device: str = "cpu") -> tuple[list[float], dict]:
    """Each row's pass rate under the model in `model_dir` (k samples, RL's sampling settings), and counts."""
    from posttrain.eval.evaluate import generator

    tok = load_tokenizer(model_dir)
    gen = generator(model_dir, tok, EvalConfig(temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
                                               max_new_tokens=rl.max_new_tokens, batch_size=cfg.batch_size,
                                               seed=cfg.seed, backend=cfg.backend), device)
    k = cfg.samples_per_prompt
    with RewardScorer(reward) as scorer:
        scorer.check_arguments({c for ex in rows for c in (ex.get("columns") or {})})
        samples, _, results = sample_and_score(rows, gen, tok, scorer, n=k, temperature=rl.temperature)
    failed = [r.failure for r in results if r.failure is not None]
    if len(failed) > rl.max_reward_failure_rate * len(results):  # a broken reward is not "never solved"
        raise ValueError(f"data.pass_rate: {len(failed)} of {len(results)} reward calls failed (more than "
                         f"rl.max_reward_failure_rate = {rl.max_reward_failure_rate}), e.g. {failed[0]}")
    passed = [r.failure is None and r.score >= 1.0 for r in results]
    rates = [sum(passed[i * k:(i + 1) * k]) / k for i in range(len(rows))]
    return rates, {"reward_failures": sum(r.failure is not None for r in results),
                   "generated_tokens": sum(len(g.response_ids) for g in samples)}


def select_by_pass_rate(model_dir: str | Path, dataset_dir: str | Path, cfg: PassRateConfig, rl: RLConfig,
                        reward: RewardConfig, out_dir: str | Path, *, device: str = "cpu") -> PassRateInfo:
    """Keep the train prompts of the dataset in `dataset_dir` whose pass rate under the model lies strictly
    between cfg.min_rate and cfg.max_rate; write the selected dataset into `out_dir` (absent or empty). Refuses
    a selection that keeps no prompt, naming the rates it found."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"pass-rate output folder {out_dir} is not empty")
    train = read_examples(dataset_dir, "train")
    sampled = [i for i, ex in enumerate(train) if ex.get("answer") is not None or reward.fn][:cfg.max_prompts or None]
    if not sampled:
        raise ValueError(f"{dataset_dir}: no train prompts to measure (rows need a reference answer for the built-in "
                         "verifier, or set reward.fn)")
    rates, counts = pass_rates([train[i] for i in sampled], model_dir, cfg, rl, reward, device=device)
    kept = [i for i, r in zip(sampled, rates) if cfg.min_rate < r < cfg.max_rate]
    info = PassRateInfo(sampled=len(sampled), kept=len(kept), never_solved=sum(r == 0 for r in rates),
                        always_solved=sum(r == 1 for r in rates), mean_rate=sum(rates) / len(rates),
                        samples_per_prompt=cfg.samples_per_prompt, **counts)
    print(f"pass_rate: kept {info.kept} of {info.sampled} train prompts ({info.never_solved} never solved, "
          f"{info.always_solved} always, mean rate {info.mean_rate:.3f}, {cfg.samples_per_prompt} samples each)",
          flush=True)
    if not kept:
        raise ValueError(f"data.pass_rate: no train prompt has a pass rate strictly between {cfg.min_rate} and "
                         f"{cfg.max_rate} ({info.never_solved} of {info.sampled} never solved, {info.always_solved} "
                         "always): nothing left to train on; widen the band or raise samples_per_prompt")
    source = json.loads((Path(dataset_dir) / "info.json").read_text())
    write_dataset(out_dir, [train[i] for i in kept], read_examples(dataset_dir, "eval"),
                  {**source, "num_train": len(kept),
                   "pass_rate": {**asdict(info), "min_rate": cfg.min_rate, "max_rate": cfg.max_rate,
                                 "refresh_every": cfg.refresh_every,
                                 "rates": [[i, r] for i, r in zip(sampled, rates)]}},
                  more={"pool": [train[i] for i in sampled]} if cfg.refresh_every else None)
    return info
