"""What bench/rl.py's placement and engines sections share: a tiny model to time, one local Ray per section,
and a few RL steps through `run_rl` from a model folder in a fresh store."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path


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


@contextmanager
def local_ray():
    """One local Ray for a section (run_rl reuses it), quiet workers, one logical CPU per core."""
    import ray

    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    try:
        yield
    finally:
        ray.shutdown()


def run_steps(recipe, rl_cfg, placement_cfg, model_dir: Path, dataset_dir: Path, root: Path, name: str,
              *, model_cfg=None) -> tuple[list, float]:
    """`rl_cfg.steps` RL steps (no checkpoints) from model_dir: (the steps' metrics after the first - a warm-up -,
    wall seconds of the whole run_rl call)."""
    from posttrain.artifacts import ArtifactStore
    from posttrain.config import TrackingConfig
    from posttrain.rl.run import run_rl

    store = ArtifactStore(root / "store")
    m = store.put("model", "start", model_dir, run_id="bench", parents=[], config={})
    d = store.put("dataset", "data", dataset_dir, run_id="bench", parents=[], config={})
    t0 = time.perf_counter()
    res = run_rl(rl_cfg=replace(rl_cfg, checkpoint_every=0), reward_cfg=recipe.reward, model_cfg=model_cfg,
                 placement_cfg=placement_cfg, max_seq_len=recipe.model.max_seq_len,
                 tracking_cfg=TrackingConfig(wandb=False, log_every=10**6), start_model_dir=model_dir,
                 dataset_dir=dataset_dir, store_root=str(store.root), run_id=f"bench-{name}", parents=[m.id, d.id],
                 state_dir=root / f"state-{name}", start_model_id=m.id)
    return res.history[1:] or res.history, time.perf_counter() - t0
