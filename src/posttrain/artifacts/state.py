"""Resumable training state under the store's root: `<root>/state/<stage>/<key>/`, on any fsspec filesystem.

A stage retried on another node (a Flyte retry, a new pod) must find what the killed attempt saved, so SFT and
RL state live under the same root as the artifacts - a local folder, or an `s3://`/`gs://`/... URL - never in
the pod's /tmp. Every writer commits through one small file written last (SFT: `step-N/meta.json`; RL: the
`LATEST` pointer), and a single-object write is atomic on object stores; on a local disk `write_text` is a
temporary file + rename. So a kill at any moment leaves the previous committed state readable.

What is appended every step (RL's `steps.jsonl`) stays in a local work folder (`work`):
the state folder itself for a local root; `~/.cache/posttrain/state/<hash of the URL>` for a remote one. RL
copies its step log into each committed step folder, so another node's resume starts from that copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import fsspec


def is_local(fs) -> bool:
    """The fsspec filesystem is this machine's disk."""
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def local_cache(kind: str, url: str) -> Path:
    """This machine's folder for what belongs to a remote URL: ~/.cache/posttrain/<kind>/<hash of the URL>."""
    return Path.home() / ".cache" / "posttrain" / kind / hashlib.sha256(url.encode()).hexdigest()[:16]


class StateDir:
    """One stage's state folder: a local path or an fsspec URL (see the module docstring)."""

    def __init__(self, location: str | os.PathLike):
        location = str(location)
        self.fs, path = fsspec.core.url_to_fs(location)
        self.local = is_local(self.fs)
        self.location = str(Path(path).resolve()) if self.local else location.rstrip("/")
        self._path = self.location if self.local else path.rstrip("/")
        self.work = Path(self.location) if self.local else local_cache("state", self.location)
        self.work.mkdir(parents=True, exist_ok=True)

    @classmethod
    def under_store(cls, store_root: str, stage: str, key: str) -> StateDir:
        """The state folder of one stage run, keyed by its inputs (stable across retries and nodes)."""
        return cls(f"{str(store_root).rstrip('/')}/state/{stage}/{key[:24]}")

    def __str__(self) -> str:
        return self.location

    def url(self, *parts: str) -> str:
        """A path or URL inside this folder, as torch.distributed.checkpoint and fsspec.open accept it."""
        return "/".join([self.location, *parts])

    def _p(self, rel: str) -> str:
        return f"{self._path}/{rel}"

    def exists(self, rel: str) -> bool:
        self.fs.invalidate_cache()  # another process (or node) may have written it since we last looked
        return self.fs.exists(self._p(rel))

    def read_text(self, rel: str) -> str | None:
        """The file's text; None when it does not exist."""
        return get_text(self.url(rel))

    def write_text(self, rel: str, text: str) -> None:
        """Atomic: readers see the old content or the new, never part of it."""
        put_text(self.url(rel), text)

    def names(self, prefix: str) -> list[str]:
        """Sorted names of the entries directly in this folder that start with `prefix`."""
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(self._path, detail=False)
        except FileNotFoundError:
            return []
        return sorted(n for n in (e.rstrip("/").rsplit("/", 1)[-1] for e in entries) if n.startswith(prefix))

    def remove(self, rel: str) -> None:
        """Delete a file or folder (recursively); nothing when it is not there."""
        if self.exists(rel):
            self.fs.rm(self._p(rel), recursive=True)

    def drop(self) -> None:
        """Delete the state folder and its local work folder."""
        self.fs.invalidate_cache()
        if self.fs.exists(self._path):
            self.fs.rm(self._path, recursive=True)
        if self.work.exists():
            shutil.rmtree(self.work)


def write_atomic(path: Path, text: str) -> None:
    """Write a local text file through a temporary name, fsynced, renamed into place: readers see the old
    content or the new, never part of it."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def get_text(url: str) -> str | None:
    """A small text file at a path or URL; None when it does not exist."""
    fs, path = fsspec.core.url_to_fs(url)
    try:
        return fs.cat_file(path).decode()
    except FileNotFoundError:
        return None


def put_text(url: str, text: str) -> None:
    """Write a small text file at a path or URL atomically - readers see the old content or the new, never
    part of it: locally through `write_atomic`, remotely as one PUT (atomic on object stores)."""
    fs, path = fsspec.core.url_to_fs(url)
    if is_local(fs):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(path), text)
    else:
        fs.pipe_file(path, text.encode())


def write_file(url: str, write: Callable[[str], None]) -> None:
    """Write one file at a path or URL with a writer that wants a local path (safetensors, torch.save):
    locally into a temporary name renamed into place; remotely into a local temporary file then uploaded."""
    fs, path = fsspec.core.url_to_fs(url)
    if is_local(fs):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        write(tmp)
        os.replace(tmp, path)
        return
    with tempfile.TemporaryDirectory(prefix="posttrain-upload-") as d:
        local = os.path.join(d, os.path.basename(path))
        write(local)
        fs.put_file(local, path)


def read_file(url: str, read: Callable[[str], object]) -> object:
    """`read(local path)` of a file at a path or URL (downloaded to a temporary file when remote)."""
    fs, path = fsspec.core.url_to_fs(url)
    if is_local(fs):
        return read(path)
    with tempfile.TemporaryDirectory(prefix="posttrain-download-") as d:
        local = os.path.join(d, os.path.basename(path))
        fs.get_file(path, local)
        return read(local)
