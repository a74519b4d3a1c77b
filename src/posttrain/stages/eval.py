"""The evaluation stage: score a model on a dataset's held-out split with the task's verifier or the user's
reward function and store an `eval` artifact, cached on the settings, the two ids and the code."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from posttrain.artifacts import ArtifactRef, ArtifactStore
from posttrain.config import EvalConfig, RewardConfig, TrackingConfig, to_dict
from posttrain.models.folders import model_folder
from posttrain.stages.support import finished_on_error, source_digest
from posttrain.tracking.wandb_run import WandbRun


@dataclass(frozen=True, kw_only=True)
class EvalOutputs:
    report: ArtifactRef
    greedy_accuracy: float
    sampled_accuracy: float | None
    """None when eval.k == 0 (greedy only)."""
    pass_at_k: float | None
    """None when eval.k == 0 (greedy only)."""
    reward_failures: int = 0
    """Reward calls that failed (counted as incorrect); the report holds example reasons."""


def evaluate(cfg: EvalConfig, reward: RewardConfig, *, model: ArtifactRef, dataset: ArtifactRef, run_id: str,
             store: ArtifactStore | None = None, tracking: TrackingConfig | None = None) -> EvalOutputs:
    """Score the model on the dataset's held-out split and store an `eval` artifact (parent: the model).
    The manifest's metrics hold sampled_accuracy and pass_at_k only when eval.k > 0. With `tracking` (and
    tracking.wandb), a new evaluation is also a wandb run with its numbers and a per-problem table."""
    from posttrain.envs.plan import check_episodes
    from posttrain.eval import evaluate as run_eval
    from posttrain.rewards import reward_identity

    store = store or ArtifactStore()
    reward = reward.function_only()  # evaluation scores with the function or verifier alone
    # eval.environment / eval.tools: they import in a short-lived child and the template can keep an episode's
    # tokens, or this fails naming why; their source hashes key the cache (an edited environment re-evaluates)
    episodes = check_episodes(cfg, str(model_folder(store, model))) if cfg.environment or cfg.tools else {}
    code = ("eval", "models", "rewards", "data/verifiers.py", "data/examples.py", *(("envs",) if episodes else ()))
    key = store.cache_key("eval", to_dict(cfg), to_dict(reward), model.id, dataset.id, source_digest(*code),
                          *((episodes,) if episodes else ()), *((reward_identity(reward),) if reward.fn else ()))
    ref = store.cache_get(key)
    if ref is None:
        report = run_eval(model_folder(store, model), store.get(dataset), cfg, reward)
        with tempfile.TemporaryDirectory(prefix="posttrain-eval-") as tmp:
            report.write(Path(tmp))
            metrics = {"greedy_accuracy": report.greedy_accuracy, "num_problems": report.num_problems,
                       "reward_calls": report.reward_calls, "reward_failures": report.reward_failures}
            if report.sampled_accuracy is not None:
                metrics.update(sampled_accuracy=report.sampled_accuracy, pass_at_k=report.pass_at_k)
            if report.episodes is not None:
                metrics.update({f"env/{k}": v for k, v in report.episodes.items()
                                if k in ("turns_mean", "tool_calls_mean", "finished", "env_reward_mean") and v is not None})
            ref = store.put("eval", f"eval-{model.name}", Path(tmp), run_id=run_id, parents=[model.id, dataset.id],
                            config={**to_dict(cfg), "reward": to_dict(reward), "dataset_id": dataset.id,
                                    "model_id": model.id, **({"environment": episodes} if episodes else {})},
                            metrics=metrics)
        store.cache_put(key, ref)
        if tracking is not None:
            _eval_to_wandb(tracking, report, metrics, ref=ref, model=model, dataset=dataset, run_id=run_id,
                           store=store, settings={"eval": cfg, "reward": reward})
    m = store.manifest(ref.id).metrics
    sampled, pass_k = m.get("sampled_accuracy"), m.get("pass_at_k")
    failures = m.get("reward_failures", 0)

    def _fmt(x: float | None) -> str:  # "n/a": not measured (eval.k == 0)
        return "n/a" if x is None else f"{x:.3f}"

    print(f"eval {ref.short} of model {model.short}: greedy {m['greedy_accuracy']:.3f}, sampled {_fmt(sampled)}, "
          f"pass@k {_fmt(pass_k)} on {m['num_problems']} problems"
          + (f"; {failures}/{m.get('reward_calls')} reward calls failed (see the report)" if failures else ""))
    return EvalOutputs(report=ref, greedy_accuracy=m["greedy_accuracy"], sampled_accuracy=sampled, pass_at_k=pass_k,
                       reward_failures=failures)


def _eval_to_wandb(tracking: TrackingConfig, report, metrics: dict, *, ref: ArtifactRef, model: ArtifactRef,
                   dataset: ArtifactRef, run_id: str, store: ArtifactStore, settings: dict) -> None:
    """One wandb run for one evaluation: its numbers as the summary, every problem as a table row."""
    run = WandbRun.for_stage(tracking, stage="eval", run_id=run_id, store=store, settings=settings,
                             inputs={"model": model.id, "dataset": dataset.id}, name=f"eval-{model.name}-{run_id}")
    if run is None:
        return
    run.start()
    with finished_on_error(run):
        columns = ["prompt", "answer", "greedy", "score", "correct", "failure", "sampled_correct"]
        run.log_table("eval/problems", columns, [[p.get(c) for c in columns] for p in report.problems])
        run.finish(outputs={"eval": ref.id}, summary={k: v for k, v in metrics.items() if v is not None})
