"""What every config check uses: the check itself, the shape of an import path, and whether vLLM is there."""

from __future__ import annotations

import importlib.util

from posttrain.config.errors import ConfigError

VLLM_INSTALL_COMMAND = "make install-vllm"
"""vLLM is an optional extra in its own environment (.venv-vllm, pinned by requirements-vllm.lock)."""

NO_VLLM = (f"'vllm' needs vLLM, which is not installed in this environment; install it with "
           f"`{VLLM_INSTALL_COMMAND}` (its own environment, .venv-vllm) and run with `make run-vllm`")


def check(ok: bool, field_path: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{field_path}: {message}")


def vllm_installed() -> bool:
    """Looked up through this module by every check (tests replace it here). Whether `import vllm` would find a package: looked up, not imported (importing it takes seconds).
    Every local task runs in the Python that validates the config, so this is where the run would need it."""
    return importlib.util.find_spec("vllm") is not None


def is_import_path(s: str) -> bool:
    mod, sep, fn = s.partition(":")
    return bool(sep) and all(p.isidentifier() for p in mod.split(".")) and fn.isidentifier()
