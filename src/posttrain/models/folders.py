"""The loadable HF folder of a stored model: what every stage that reads a model (eval, RL's start model, a
teacher, a reward model, pairs, export) opens.

A full model's folder is the artifact's own. An adapter artifact (a stage trained with `model.lora`) stores only
peft's adapter files and the tokenizer, and names its base model in `extra.adapter_of` (also a parent); its
folder is the base's - itself possibly an adapter - with the adapter merged in, built once into
`<store>/merged/<id>` (for a remote store, `~/.cache/posttrain/merged/<id>`) and reused. A merged folder is
derived data: it is written to a temporary name and renamed into place complete, so a half-written one is never
read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from posttrain.artifacts import ArtifactRef, ArtifactStore


def merged_root(store: ArtifactStore) -> Path:
    return Path(store.root) / "merged" if store.local else Path.home() / ".cache" / "posttrain" / "merged"


def model_folder(store: ArtifactStore, ref: ArtifactRef | str) -> Path:
    """An HF folder holding the model artifact `ref` as full weights (see the module docstring)."""
    from posttrain.models.lora import is_adapter_dir

    path = store.get(ref)
    if not is_adapter_dir(path):
        return path
    m = store.manifest(ref)
    base_id = m.extra.get("adapter_of")
    if not base_id:
        raise ValueError(f"artifact {m.id[:12]} ({m.kind} {m.name}) holds a LoRA adapter but names no base model "
                         f"(extra.adapter_of)")
    out = merged_root(store) / m.id
    if (out / "config.json").exists():
        return out
    base_dir = model_folder(store, base_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{m.id[:12]}-", dir=out.parent))
    try:
        write_merged(base_dir, path, tmp, reward_model=m.kind == "reward_model")
        try:
            os.rename(tmp, out)
        except OSError:  # another process renamed its copy first: same content, keep that one
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"model {m.id[:12]}: adapter merged into base {base_id[:12]} -> {out}", flush=True)
    return out


def write_merged(base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path, *,
                 reward_model: bool = False) -> None:
    """The base folder's model with the adapter folder's LoRA merged in, saved as a plain HF folder (with the
    adapter folder's tokenizer) that transformers 5.x and 4.57 load unchanged."""
    from posttrain.models.io import load_model, load_tokenizer, save_model
    from posttrain.models.lora import merged_with_adapter

    tokenizer = load_tokenizer(adapter_dir)
    if reward_model:
        from posttrain.models.reward_model import build_reward_model

        model = build_reward_model(base_dir, tokenizer)
    else:
        model = load_model(base_dir)
    model.load_state_dict(merged_with_adapter(model.state_dict(), adapter_dir), strict=True)
    save_model(model, tokenizer, out_dir)
