"""The closing summary of a run: accuracy after SFT and after RL, and every artifact id. Sampled accuracy
and pass@k exist only for evaluations with eval.k > 0: missing ones are -1.0 here and print as "n/a"."""

from __future__ import annotations

from dataclasses import dataclass

from flytekit import task

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef

MISSING = -1.0
"""A number that was not measured (no RL eval, or eval.k == 0 for sampled accuracy)."""


@dataclass(frozen=True, kw_only=True)
class Summary:
    run_id: str
    dataset_id: str
    sft_model_id: str
    sft_eval_id: str
    sft_greedy_accuracy: float
    sft_sampled_accuracy: float = MISSING
    rl_model_id: str = ""
    rl_eval_id: str = ""
    rl_greedy_accuracy: float = MISSING
    rl_sampled_accuracy: float = MISSING


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _diff(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None else f"{a - b:+.3f}"


@task(container_image=cpu_image)
def summarize(run_id: str, dataset: ArtifactRef, sft_model: ArtifactRef, sft_eval: ArtifactRef,
              rl_model: ArtifactRef | None, rl_eval: ArtifactRef | None, second_stage: str = "rl") -> Summary:
    """`second_stage`: what made the second model ("rl", or "dpo" in dpo_pipeline); the Summary's rl_* fields
    hold it."""
    from posttrain.artifacts import ArtifactStore

    store = ArtifactStore()
    sm = store.manifest(sft_eval.id).metrics
    rm = store.manifest(rl_eval.id).metrics if rl_eval else None
    s_sampled = sm.get("sampled_accuracy")
    r_sampled = rm.get("sampled_accuracy") if rm else None
    s = Summary(run_id=run_id, dataset_id=dataset.id, sft_model_id=sft_model.id, sft_eval_id=sft_eval.id,
                sft_greedy_accuracy=sm["greedy_accuracy"],
                sft_sampled_accuracy=MISSING if s_sampled is None else s_sampled,
                rl_model_id=rl_model.id if rl_model else "", rl_eval_id=rl_eval.id if rl_eval else "",
                rl_greedy_accuracy=rm["greedy_accuracy"] if rm else MISSING,
                rl_sampled_accuracy=MISSING if r_sampled is None else r_sampled)

    def scores(m: dict) -> str:
        failed = m.get("reward_failures", 0)
        return (f"greedy {m['greedy_accuracy']:.3f}  sampled {_fmt(m.get('sampled_accuracy'))}"
                f"  pass@k {_fmt(m.get('pass_at_k'))}"
                + (f"  ({failed}/{m.get('reward_calls')} reward calls failed)" if failed else ""))

    # with sft.enabled false the first model is the one RL started from (a base folder or a model artifact)
    first = {"sft": "SFT model  ", "distill": "student    "}.get(store.manifest(sft_model.id).stage, "start model")
    label = f"{second_stage.upper()} model".ljust(11)
    lines = [f"run {run_id}  (store: {store.root})",
             f"  dataset     {dataset.id[:12]}",
             f"  {first} {sft_model.id[:12]}   eval {sft_eval.id[:12]}: {scores(sm)}  ({sm['num_problems']} problems)"]
    if rm:
        lines.append(f"  {label} {rl_model.id[:12]}   eval {rl_eval.id[:12]}: {scores(rm)}")
        change = f"{second_stage.upper()} change"
        lines.append(f"  {change:<11} greedy {rm['greedy_accuracy'] - sm['greedy_accuracy']:+.3f}"
                     f"  sampled {_diff(r_sampled, s_sampled)}")
    lines.append(f"  lineage:    posttrain lineage {(rl_model or sft_model).id[:12]}")
    lines.extend(_wandb_lines(str(store.root), run_id))
    print("\n".join(["=" * 78, *lines, "=" * 78]), flush=True)
    return s


def _wandb_lines(store_root: str, run_id: str) -> list[str]:
    """Where this run's offline wandb runs are and how to upload them (nothing when tracking.wandb is off)."""
    from posttrain.tracking.wandb_run import offline_runs

    runs = offline_runs(store_root, run_id)
    if not runs:
        return []
    where = runs[0].rsplit("/", 1)[0]
    sync = (f"wandb sync {where}/offline-run-*" if "://" not in where else
            "copy them to a machine with wandb (e.g. fsspec/aws s3 cp --recursive), then wandb sync <folder>")
    return [f"  wandb:      {len(runs)} offline runs (one per stage, group {run_id}) in {where}",
            f"              upload: {sync}"]
