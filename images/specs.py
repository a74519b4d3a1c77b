"""The container image of the project, as a flytekit ImageSpec, pinned to one set.

It installs `requirements.lock` - the exact set `make` installs locally - so a cluster run uses the same
library versions as a laptop run. The registry comes from `POSTTRAIN_REGISTRY` (default
`localhost:30000`, the registry of a Flyte sandbox). Building needs a registry and a builder (docker or
envd), which is why it is not part of the local run: `pyflyte run` without `--remote` executes the tasks in
this Python process and never builds. On a cluster: `pyflyte run --remote workflows/pipeline.py pipeline`
(fast registration ships `src/` and the task code; `PYTHONPATH` below makes the library importable).

Every task uses `cpu_image`. There is no GPU image: a task's image is fixed when the task is defined (at
import, like the settings in tasks/settings.py), while the recipe - `gpu_single` or any other - is an input
of the run, so no task could pick an image by recipe. A GPU image that no task named was removed; a GPU
cluster path needs an import-time switch for the sft/rl/evaluate tasks' image and GPU requests together.
"""

from __future__ import annotations

import os
from pathlib import Path

from flytekit import ImageSpec

_ROOT = Path(__file__).resolve().parent.parent
_REGISTRY = os.environ.get("POSTTRAIN_REGISTRY", "localhost:30000")
_LOCK = str(_ROOT / "requirements.lock")
_ENV = {"PYTHONPATH": "/root/src:/root", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}

cpu_image = ImageSpec(
    name="posttrain-cpu",
    python_version="3.11",
    requirements=_LOCK,
    registry=_REGISTRY,
    env=_ENV,
)
"""Every task's image: data prep, SFT (gloo on CPU), evaluation, the RL Ray job and the small tasks."""
