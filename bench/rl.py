"""RL step benchmark: COLOCATED vs SPLIT placement on the default-size tiny model (tiny_cpu recipe).

Measures, per placement mode, on one local Ray started here: mean step wall time, generated tokens/s
(rollout phase), the orchestration-overhead share (1 - worker-timed compute / step wall time) and the
phase breakdown; prints a table and SPLIT's ratios against COLOCATED measured in the same run. The model
is built from scratch (random init: rewards are all 0, which changes no timing - the update still runs its
full forward/backward). The first step of each run is a warm-up and is left out.

    .venv/bin/python bench/rl.py            # about 1-2 minutes on 2 cores
    BENCH_RL_STEPS=20 .venv/bin/python bench/rl.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

STEPS = int(os.environ.get("BENCH_RL_STEPS", "8"))


def build_inputs(root: Path, recipe) -> tuple[Path, Path]:
    """A small addition dataset, its tokenizer and a from-scratch model of the recipe's size."""
    from posttrain.data.prepare import prepare_dataset
    from posttrain.models.io import save_model
    from posttrain.models.tiny import build_model
    from posttrain.models.tokenizer import tokenizer_training_texts, train_tokenizer

    data = replace(recipe.data, num_examples=3000, eval_size=100)
    prepare_dataset(data, root / "dataset")
    tok = train_tokenizer(tokenizer_training_texts(root / "dataset"), data.tokenizer.vocab_size, root / "tokenizer")
    save_model(build_model(recipe.model, tok), tok, root / "model")
    return root / "model", root / "dataset"


def run_mode(mode, recipe, model_dir: Path, dataset_dir: Path, root: Path) -> dict:
    from posttrain.artifacts import ArtifactStore
    from posttrain.config import TrackingConfig
    from posttrain.rl.run import run_rl

    store = ArtifactStore(root / "store")
    m = store.put("model", "start", model_dir, run_id="bench", parents=[], config={})
    d = store.put("dataset", "data", dataset_dir, run_id="bench", parents=[], config={})
    cfg = replace(recipe.rl, steps=STEPS, checkpoint_every=0, kl_coef=0.01)  # kl > 0: all four roles run
    t0 = time.perf_counter()
    res = run_rl(rl_cfg=cfg, reward_cfg=recipe.reward, placement_cfg=replace(recipe.placement, mode=mode), max_seq_len=recipe.model.max_seq_len,
                 tracking_cfg=TrackingConfig(wandb_mode="disabled", log_every=10**6), start_model_dir=model_dir,
                 dataset_dir=dataset_dir, store_root=str(store.root), run_id=f"bench-{mode.value}",
                 parents=[m.id, d.id], state_dir=root / f"state-{mode.value}", start_model_id=m.id)
    total = time.perf_counter() - t0
    h = res.history[1:] or res.history
    mean = lambda xs: statistics.fmean(xs)
    return {"mode": mode.value, "total_s": total, "step_s": mean([x.step_s for x in h]),
            "tok_s": mean([x.generated_tokens_per_s for x in h]),
            "overhead": mean([x.orchestration_overhead for x in h]),
            **{f"{k}_s": mean([x.phase_s.get(k, 0.0) for x in h]) for k in ("rollout", "drift", "reward", "reference",
                                                                           "update", "sync")}}


def main() -> int:
    import ray

    from posttrain.config import PlacementMode
    from posttrain.recipes import tiny_cpu

    recipe = tiny_cpu()
    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    with tempfile.TemporaryDirectory(prefix="bench-rl-") as tmp:
        root = Path(tmp)
        model_dir, dataset_dir = build_inputs(root, recipe)
        rows = [run_mode(mode, recipe, model_dir, dataset_dir, root / mode.value)
                for mode in (PlacementMode.COLOCATED, PlacementMode.SPLIT)]
    ray.shutdown()
    r = recipe.rl
    print(f"\nRL step benchmark: tiny_cpu model ({recipe.model.hidden_size}x{recipe.model.num_layers}), "
          f"{r.prompts_per_step} prompts x {r.samples_per_prompt} samples, {r.max_new_tokens} new tokens, "
          f"{recipe.placement.policy_workers} policy ranks, kl>0, {STEPS} steps (first left out), "
          f"{os.cpu_count()} CPUs")
    cols = ["mode", "step_s", "tok_s", "overhead", "rollout_s", "drift_s", "reward_s", "reference_s", "update_s",
            "sync_s", "total_s"]
    print(" ".join(f"{c:>11}" for c in cols))
    for row in rows:
        print(" ".join(f"{row[c]:>11}" if isinstance(row[c], str) else f"{row[c]:>11.3f}" for c in cols))
    base, split = rows
    print(f"split / colocated: step time x{split['step_s'] / base['step_s']:.2f}, "
          f"tokens/s x{split['tok_s'] / base['tok_s']:.2f}, overhead {base['overhead']:.1%} -> {split['overhead']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
