"""Small real inputs for the report pages: a store holding a prepared dataset, an SFT model, an RL model
and two evals (the RL model's and its start model's, on the same dataset), each manifest as the stages write
it; the dense stages' artifacts, made by the stages themselves on a world of one (`build_dense`, ~15 s on two
CPU cores); and a promotion decision record."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from posttrain import stages
from posttrain.artifacts import ArtifactStore
from posttrain.config import (
    DataConfig,
    DataSchema,
    DistillConfig,
    DPOConfig,
    ModelConfig,
    PairsConfig,
    RewardConfig,
    RewardModelConfig,
    SFTConfig,
    TokenizerConfig,
    TrackingConfig,
)
from posttrain.eval.report import EvalReport
from posttrain.rl.metrics import StepMetrics
from tests.files import write_folder

PHASES = {"rollout": 0.5, "reward": 0.1, "reference": 0.05, "advantages": 0.01, "update": 0.3, "sync": 0.04}


def rl_history(steps: int = 6) -> list[dict]:
    """StepMetrics.flat() of `steps` made-up but well-formed steps, as the RL checkpoints store them."""
    return [StepMetrics(step=s, policy_version=s, reward_mean=0.2 + 0.1 * s, reward_std=0.3, accuracy=0.1 * s,
                        reward_failures=int(s == 3), num_samples=16, reward_failure_example="", kl=0.01 * s,
                        entropy=1.5 - 0.1 * s, clip_fraction=0.02, loss=0.5 / s, grad_norm=1.0,
                        response_len_mean=9.0 + s, drift=1e-6 * s, generated_tokens=150, generated_tokens_per_s=300.0,
                        phase_s=dict(PHASES), compute_s={"rollout": 0.45, "reward": 0.08, "update": 0.28}, step_s=1.2,
                        orchestration_overhead=0.3).flat() for s in range(1, steps + 1)]


def sft_history(steps: int = 8) -> list[dict]:
    """Per-step SFT numbers as run_sft keeps them."""
    return [{"step": s, "loss": 3.0 / s, "lr": 1e-3 * min(1.0, s / 3), "grad_norm": 2.0 / s, "tokens_per_s": 900.0 + s}
            for s in range(1, steps + 1)]


def eval_report(greedy: float, samples: int = 4) -> EvalReport:
    """A report of `samples` problems; the first prompt holds markup, to check that it is escaped."""
    return EvalReport(
        greedy_accuracy=greedy, sampled_accuracy=greedy / 2, pass_at_k=min(1.0, greedy * 1.5), num_problems=samples,
        k=4, temperature=1.0, max_new_tokens=8, seed=0, scorer="verifier:addition", reward_calls=samples * 5,
        reward_failures=1, reward_failure_examples=["ValueError: bad"], mean_response_tokens=5.0, seconds=1.5,
        generated_tokens_per_s=40.0,
        samples=[{"prompt": "<b>1+1=</b>" if i == 0 else f"{i}+{i}=", "greedy": f"{2 * i}", "answer": f"{2 * i}",
                  "score": 1.0, "correct": True, "failure": None} for i in range(samples)],
        problems=[{"prompt": f"{i}+{i}=", "greedy": "", "answer": f"{2 * i}", "score": 0.0, "failure": None,
                   "correct": i < round(greedy * samples), "sampled_correct": 2} for i in range(samples)])


def _put_eval(store: ArtifactStore, tmp: Path, name: str, model_id: str, dataset_id: str, report: EvalReport) -> str:
    report.write(tmp / name)
    return store.put("eval", name, tmp / name, run_id="r", parents=[model_id, dataset_id],
                     config={"dataset_id": dataset_id, "model_id": model_id},
                     metrics={"greedy_accuracy": report.greedy_accuracy, "sampled_accuracy": report.sampled_accuracy,
                              "pass_at_k": report.pass_at_k, "num_problems": report.num_problems}).id


def build_store(tmp: Path) -> tuple[ArtifactStore, dict[str, str]]:
    """(store, {"dataset", "sft", "rl", "sft_eval", "rl_eval": artifact id, and build_dense's ids})."""
    store = ArtifactStore(str(tmp / "store"))
    data = DataConfig(num_examples=200, eval_size=20, num_digits=1, tokenizer=TokenizerConfig(train=False))
    ds = stages.data_prep(data, require_completions=True, run_id="r", store=store).dataset
    sft = store.put("model", "sft-x", write_folder(tmp, "sft", {"w.txt": "sft"}), run_id="r", parents=[ds.id],
                    config={}, metrics={"loss": 0.4, "steps": 8, "world_size": 2, "wall_s": 12.5},
                    extra={"stage": "sft", "start_model": None, "history": sft_history()})
    history = rl_history()
    rl = store.put("model", "rl-step6", write_folder(tmp, "rl", {"w.txt": "rl"}), run_id="r", parents=[sft.id, ds.id],
                   config={}, metrics=history[-1], extra={"start_model": sft.id, "algorithm": "grpo",
                                                          "policy_version": 6, "step": 6, "history": history})
    ids = {"dataset": ds.id, "sft": sft.id, "rl": rl.id}
    ids["sft_eval"] = _put_eval(store, tmp, "eval-sft", sft.id, ds.id, eval_report(0.25))
    ids["rl_eval"] = _put_eval(store, tmp, "eval-rl", rl.id, ds.id, eval_report(0.75))
    return store, {**ids, **build_dense(store), "preference_dataset": preference_dataset(store, tmp)}


TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64, max_seq_len=40)
_STEPS = {"steps": 4, "global_batch_size": 8, "micro_batch_size": 8, "nproc": 1, "warmup_steps": 0, "save_every": 0}


@contextlib.contextmanager
def _one_rank() -> Iterator[None]:
    """The trainer's process group as a world of one in this process; the environment and the group are put back
    afterwards, so later tests see no RANK/WORLD_SIZE and no initialized group."""
    import torch.distributed as dist

    from posttrain.spmd.dist import _free_port

    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(_free_port()))
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def preference_dataset(store: ArtifactStore, tmp: Path) -> str:
    """A user's preference file (prompt/chosen/rejected text; every prompt holds markup) through data prep."""
    rows = [{"prompt": f"<b>{i}+{i}=</b>", "chosen": f"{2 * i}", "rejected": f"{2 * i + 1}!",
             "answer": f"{2 * i}"} for i in range(12)]
    src = tmp / "prefs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(task="", files=[str(src)], schema=DataSchema.PREFERENCE, eval_size=3,
                     tokenizer=TokenizerConfig(train=False))
    return stages.data_prep(cfg, require_completions=False, run_id="prefs", store=store).dataset.id


def build_dense(store: ArtifactStore) -> dict[str, str]:
    """The dense pipelines' artifacts, each made by its stage as the workflows run it (run id "dense"): a dataset
    with a trained tokenizer -> a 4-step SFT model -> pairs from its own samples (scored by `even_length`, which
    an untrained model's samples both pass and fail) -> DPO and a reward model from the SFT model on those pairs,
    the reward model's pairwise eval; and a model distilled from the SFT model (the teacher). Returns
    {"dense_sft", "pairs", "dpo", "reward_model", "distill", "eval_pairs": artifact id}."""
    data = DataConfig(num_examples=200, eval_size=20, num_digits=1, tokenizer=TokenizerConfig(vocab_size=300))
    track = TrackingConfig(wandb=False)
    with _one_rank():
        d = stages.data_prep(data, require_completions=True, run_id="dense", store=store)
        common = {"tokenizer": d.tokenizer, "run_id": "dense", "store": store}
        sft = stages.train(TINY, SFTConfig(**_STEPS, lr=1e-2), track, dataset=d.dataset, **common)
        pairs = stages.pairs(PairsConfig(samples_per_prompt=4, max_prompts=24, eval_prompts=12, max_new_tokens=4,
                                         batch_size=64), RewardConfig(fn="tests.report_inputs:even_length"),
                             model=sft, dataset=d.dataset, run_id="dense", store=store)
        dpo = stages.train(TINY, DPOConfig(**_STEPS, lr=1e-3), track, dataset=pairs, start=sft, **common)
        rm = stages.train(TINY, RewardModelConfig(**_STEPS, lr=1e-3), track, dataset=pairs, start=sft, **common)
        kd = stages.train(TINY, DistillConfig(**_STEPS, lr=1e-3, teacher=sft.id), track, dataset=d.dataset, **common)
    ev = stages.evaluate_reward_model(reward_model=rm, pairs=pairs, run_id="dense", store=store)
    return {"dense_sft": sft.id, "pairs": pairs.id, "dpo": dpo.id, "reward_model": rm.id, "distill": kd.id,
            "eval_pairs": ev.id}


def decision(promoted: bool = True) -> dict:
    """A promotion decision record as posttrain.promotion stores it (a pinned set and one guard set)."""
    return {"time": "2026-01-01T00:00:00.000+00:00", "channel": "production", "model_id": "a" * 64,
            "eval_id": "b" * 64, "greedy_accuracy": 0.75, "greedy_accuracies": [0.75, 0.6], "min_accuracy": 0.5,
            "tolerance": 0.02, "eval_dataset_ids": ["d" * 64, "e" * 64], "eval_ids": ["b" * 64, "f" * 64],
            "holder": {"model_id": "c" * 64, "eval_ids": ["1" * 64, "2" * 64], "greedy_accuracy": 0.6,
                       "greedy_accuracies": [0.6, 0.61]},
            "promoted": promoted, "reason": "greedy accuracy 0.750 >= 0.500 and not below the holder's on any set"}


EXPECTED = {
    "dataset": {"rows": {"train", "eval", "duplicates"}, "prompt-length": {"train", "eval"},
                "completion-length": {"train", "eval"}},
    "sft": {"loss": {"loss"}, "lr": {"lr"}, "grad-norm": {"grad-norm"}, "tokens-per-s": {"tokens-per-s"}},
    "rl": {"reward": {"reward-mean", "reward-std", "accuracy"}, "kl": {"kl"}, "entropy": {"entropy"},
           "response-length": {"response-len-mean"}, "clip-fraction": {"clip-fraction"}, "drift": {"drift"},
           "policy-version": {"policy-version"}, "reward-failures": {"reward-failures"},
           "phases": {"rollout", "reward", "reference", "advantages", "update", "sync", "other"},
           "overhead": {"orchestration-overhead"}},
    "eval": {"accuracy": {"this-model", "this-model-ci", "start-model", "start-model-ci"}},
    "promotion": {"promotion": {"candidate", "current-holder", "min-accuracy"}},
    "dpo": {"loss": {"loss"}, "rewards": {"rewards-chosen", "rewards-rejected", "rewards-margin"},
            "accuracy": {"accuracy"}, "lr": {"lr"}, "grad-norm": {"grad-norm"}, "tokens-per-s": {"tokens-per-s"}},
    "reward_model": {"loss": {"loss"}, "scores": {"scores-chosen", "scores-rejected", "scores-margin"},
                     "accuracy": {"accuracy"}, "lr": {"lr"}, "grad-norm": {"grad-norm"},
                     "tokens-per-s": {"tokens-per-s"}},
    "distill": {"loss": {"loss"}, "ce": {"ce"}, "lr": {"lr"}, "grad-norm": {"grad-norm"},
                "tokens-per-s": {"tokens-per-s"}},
    "pairs": {"prompts": {"prompts"}, "pair-length": {"chosen", "rejected"}},
    "preference_dataset": {"rows": {"train", "eval"}, "pair-length": {"chosen", "rejected"}},
    "eval_pairs": {"pairwise-accuracy": {"reward-model", "reward-model-ci", "chance"},
                   "scores": {"chosen", "rejected"}},
}
"""{page: {chart: series it must draw}}; every chart a page has must be listed."""


def even_length(completion: str) -> float:
    """A reward function for the pairs stage (`tests.report_inputs:even_length`) that an untrained model's samples
    both pass and fail: 1 for an even number of characters."""
    return float(len(completion) % 2 == 0)
