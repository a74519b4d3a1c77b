"""The only container images of the project, as flytekit ImageSpecs (CPU and GPU), pinned to one set.

Both install `requirements.lock` - the exact set `make` installs locally - so a cluster run uses the same
library versions as a laptop run. The registry comes from `POSTTRAIN_REGISTRY` (default
`localhost:30000`, the registry of a Flyte sandbox). Building needs a registry and a builder (docker or
envd), which is why it is not part of the local run: `pyflyte run` without `--remote` executes the tasks in
this Python process and never builds. On a cluster: `pyflyte run --remote workflows/pipeline.py pipeline`
(fast registration ships `src/` and the task code; `PYTHONPATH` below makes the library importable).
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
"""CPU tasks: data prep, CPU SFT (gloo), evaluation, and CPU Ray workers."""

gpu_image = ImageSpec(
    name="posttrain-gpu",
    python_version="3.11",
    requirements=_LOCK,
    cuda="12.8",
    registry=_REGISTRY,
    env={**_ENV, "NCCL_DEBUG": "WARN"},
)
"""GPU tasks: SFT with NCCL and bf16, and the Ray rollout/train worker groups."""
