"""The container image holds every import the tasks make: `images/specs.py`'s ImageSpec installs
requirements.lock, so every third-party module that the task code, the workflows and the library import must come
from a distribution pinned there - not from something installed by hand or by `make` beside the lock."""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = {"vllm"}
"""Imported only when a setting asks for it, and not part of the image (the optional vLLM extra)."""


def _locked() -> set[str]:
    names = set()
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==", line.strip())
        if m:
            names.add(re.sub(r"[-_.]+", "-", m.group(1)).lower())
    return names


def _vendored_by_a_locked_distribution(module, locked: set[str]) -> bool:
    """True when the module's file is one of a locked distribution's own files: Ray ships psutil and colorama in
    ray/thirdparty_files and puts that folder on sys.path, so they come into the image with ray."""
    file = getattr(module, "__file__", None)
    if not file:
        return False
    file = Path(file).resolve()
    for dist in importlib.metadata.distributions():
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if name in locked and any(Path(dist.locate_file(f)).resolve() == file for f in dist.files or ()):
            return True
    return False


def test_the_image_installs_the_lock_and_finds_the_code():
    from images.specs import cpu_image

    assert Path(cpu_image.requirements).resolve() == ROOT / "requirements.lock"
    assert set(cpu_image.env["PYTHONPATH"].split(":")) >= {"/root/src", "/root"}  # src/posttrain, tasks, workflows


def test_every_module_the_tasks_import_is_pinned_in_the_lock():
    import posttrain

    roots = ["tasks", "workflows", "images"]
    for name in roots:
        importlib.import_module(name)
    for mod in pkgutil.walk_packages(posttrain.__path__, "posttrain."):
        try:
            importlib.import_module(mod.name)
        except ImportError as e:
            assert e.name and e.name.split(".")[0] in OPTIONAL, f"{mod.name}: {e}"
    for path in (ROOT / "tasks").glob("*.py"):
        importlib.import_module(f"tasks.{path.stem}")
    for path in (ROOT / "workflows").glob("*.py"):
        importlib.import_module(f"workflows.{path.stem}")
    dists = importlib.metadata.packages_distributions()
    locked = _locked()
    own = {"posttrain", "tasks", "workflows", "images", "tests"}
    missing = {}
    for top in {m.split(".")[0] for m in list(sys.modules)}:
        if top in sys.stdlib_module_names or top in own or top.startswith("_") or top not in dists:
            continue
        names = {re.sub(r"[-_.]+", "-", d).lower() for d in dists[top]}
        if not names & locked and not _vendored_by_a_locked_distribution(sys.modules[top], locked):
            missing[top] = sorted(names)
    assert not missing, f"imported but not pinned in requirements.lock (so not in the image): {missing}"
