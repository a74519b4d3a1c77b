"""The closing summary of a run: accuracy after SFT and after RL, and every artifact id."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from flytekit import task

from images.specs import cpu_image
from posttrain.artifacts.handles import ArtifactRef


@dataclass(frozen=True, kw_only=True)
class Summary:
    run_id: str
    dataset_id: str
    sft_model_id: str
    sft_eval_id: str
    sft_greedy_accuracy: float
    sft_sampled_accuracy: float
    rl_model_id: str = ""
    rl_eval_id: str = ""
    rl_greedy_accuracy: float = -1.0
    rl_sampled_accuracy: float = -1.0


@task(container_image=cpu_image)
def summarize(run_id: str, dataset: ArtifactRef, sft_model: ArtifactRef, sft_eval: ArtifactRef,
              rl_model: Optional[ArtifactRef], rl_eval: Optional[ArtifactRef]) -> Summary:
    from posttrain.artifacts import ArtifactStore

    store = ArtifactStore()
    sm = store.manifest(sft_eval.id).metrics
    rm = store.manifest(rl_eval.id).metrics if rl_eval else None
    s = Summary(run_id=run_id, dataset_id=dataset.id, sft_model_id=sft_model.id, sft_eval_id=sft_eval.id,
                sft_greedy_accuracy=sm["greedy_accuracy"], sft_sampled_accuracy=sm["sampled_accuracy"],
                rl_model_id=rl_model.id if rl_model else "", rl_eval_id=rl_eval.id if rl_eval else "",
                rl_greedy_accuracy=rm["greedy_accuracy"] if rm else -1.0,
                rl_sampled_accuracy=rm["sampled_accuracy"] if rm else -1.0)
    lines = [f"run {run_id}  (store: {store.root})",
             f"  dataset     {dataset.id[:12]}",
             f"  SFT model   {sft_model.id[:12]}   eval {sft_eval.id[:12]}: greedy {sm['greedy_accuracy']:.3f}"
             f"  sampled {sm['sampled_accuracy']:.3f}  pass@k {sm['pass_at_k']:.3f}  ({sm['num_problems']} problems)"]
    if rm:
        lines.append(f"  RL model    {rl_model.id[:12]}   eval {rl_eval.id[:12]}: greedy {rm['greedy_accuracy']:.3f}"
                     f"  sampled {rm['sampled_accuracy']:.3f}  pass@k {rm['pass_at_k']:.3f}")
        lines.append(f"  RL change   greedy {rm['greedy_accuracy'] - sm['greedy_accuracy']:+.3f}"
                     f"  sampled {rm['sampled_accuracy'] - sm['sampled_accuracy']:+.3f}")
    lines.append(f"  lineage:    posttrain lineage {(rl_model or sft_model).id[:12]}")
    print("\n".join(["=" * 78, *lines, "=" * 78]), flush=True)
    return s
