"""Rollout engines inside whole RL steps (the `engines` section of bench/rl.py): the same recipe run for a few
steps with rl.rollout_backend "transformers" and then "vllm", on one local Ray.

Models: `tiny` - the tiny_cpu recipe's size, random init (rewards all 0; timing is unchanged: the update still
runs its full forward/backward); `smollm2` - SmolLM2-135M-Instruct under small_instruct_cpu (`make real-model`
builds it; skipped with a message when its folder is missing). Per engine: generated tokens/s of the rollout
phase and mean step wall time over the steps after the first (a warm-up: vLLM allocates its KV cache then).
vLLM rows need vllm importable (`make install-vllm`, run under .venv-vllm/bin/python); without it only the
transformers rows run.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from rl_runs import build_inputs, run_steps


def smollm2_inputs(recipe, root: Path) -> tuple[Path, Path] | None:
    from posttrain.data.prepare import prepare_dataset

    model_dir = Path(recipe.model.base_path)
    if not any(model_dir.glob("*.safetensors")):
        return None
    prepare_dataset(recipe.data, root / "dataset", require_completions=False)
    return model_dir, root / "dataset"


def run_engine(recipe, backend, steps: int, model_dir: Path, dataset_dir: Path, root: Path) -> dict:
    cfg = replace(recipe.rl, steps=steps, rollout_backend=backend)
    h, total = run_steps(recipe, cfg, recipe.placement, model_dir, dataset_dir, root, backend.value,
                         model_cfg=recipe.model)
    return {"engine": backend.value, "tok_s": statistics.fmean(x.generated_tokens_per_s for x in h),
            "rollout_s": statistics.fmean(x.phase_s["rollout"] for x in h),
            "step_s": statistics.fmean(x.step_s for x in h), "total_s": total}


def bench(models: list[str], steps: int) -> list[tuple[str, list[dict]]]:
    """[(model label, rows per engine)]."""
    from posttrain.config import RolloutBackend
    from posttrain.config.checks import vllm_installed
    from posttrain.recipes import small_instruct_cpu, tiny_cpu

    backends = [RolloutBackend.TRANSFORMERS]
    if vllm_installed():
        backends.append(RolloutBackend.VLLM)
    else:
        print("engines: vllm is not importable here - the vLLM rows need `make install-vllm` and "
              ".venv-vllm/bin/python bench/rl.py; running the transformers rows only", flush=True)
    out = []
    for name in models:
        recipe = tiny_cpu() if name == "tiny" else small_instruct_cpu()
        with tempfile.TemporaryDirectory(prefix=f"bench-rl-engines-{name}-") as tmp:
            root = Path(tmp)
            inputs = build_inputs(root, recipe) if name == "tiny" else smollm2_inputs(recipe, root)
            if inputs is None:
                print(f"engines: SmolLM2 skipped - no safetensors in {recipe.model.base_path} (run `make real-model`)")
                continue
            label = (f"{name} ({recipe.name}: {recipe.rl.prompts_per_step} prompts x {recipe.rl.samples_per_prompt} "
                     f"samples x <= {recipe.rl.max_new_tokens} new tokens)")
            out.append((label, [run_engine(recipe, b, steps, *inputs, root / b.value) for b in backends]))
    return out
