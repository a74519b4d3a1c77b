"""Writing small file trees for tests (artifact sources, store fixtures)."""

from __future__ import annotations

from pathlib import Path


def write_folder(tmp: Path, name: str, files: dict[str, str]) -> Path:
    """tmp/name holding `files` ({relative path: text}); returns the folder."""
    d = tmp / name
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


def noised_model_copy(src: Path, dst: Path, scale: float, seed: int = 0) -> Path:
    """A copy of the HF model folder `src` at `dst` whose every weight tensor has Gaussian noise of `scale` x its
    own standard deviation added (a teacher that differs from the student by a chosen amount)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    g = torch.Generator().manual_seed(seed)
    save_file({k: v + scale * torch.randn(v.shape, generator=g) * v.float().std() for k, v in weights.items()},
              dst / "model.safetensors", metadata={"format": "pt"})
    return dst
