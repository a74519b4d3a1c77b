"""Code version and environment recorded in every manifest."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
from pathlib import Path

import posttrain

_REPO = Path(posttrain.__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    """{"package": version, "git_commit": sha or None, "git_dirty": bool or None}."""
    commit = dirty = None
    try:
        commit = subprocess.run(["git", "-C", str(_REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=False, timeout=10).stdout.strip() or None
        if commit:
            status = subprocess.run(["git", "-C", str(_REPO), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, check=False, text=True, timeout=10).stdout
            dirty = bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return {"package": posttrain.__version__, "git_commit": commit, "git_dirty": dirty}


def environment(world_size: int = 1) -> dict:
    """Library versions, world size and device of the process that made an artifact."""
    libs = {}
    for name in ("torch", "transformers", "tokenizers", "datasets", "flytekit", "ray", "numpy"):
        try:
            libs[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            libs[name] = None
    device = "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            device = f"cuda:{torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return {"python": platform.python_version(), "libraries": libs, "world_size": world_size, "device": device}
