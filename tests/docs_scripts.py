"""The scripts of docs/ (settings_reference, cli_reference, check_site) are files, not a package: load one as a
module for its test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

DOCS = Path(__file__).resolve().parents[1] / "docs"


def load(name: str) -> ModuleType:
    """docs/NAME.py as the module NAME (registered in sys.modules, as dataclasses and pickling expect)."""
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
