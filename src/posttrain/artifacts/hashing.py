"""Content hashing: file digests, the artifact id over (relpath, digest) pairs, and cache keys."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable

CHUNK = 1 << 20


def sha256_stream(f) -> str:
    h = hashlib.sha256()
    while chunk := f.read(CHUNK):
        h.update(chunk)
    return h.hexdigest()


def content_id(files: Iterable[tuple[str, str]]) -> str:
    """The artifact id: sha256 over the sorted (relative path, file sha256) pairs."""
    h = hashlib.sha256()
    for rel, digest in sorted(files):
        h.update(rel.encode() + b"\0" + digest.encode() + b"\n")
    return h.hexdigest()


def cache_key(*parts: Any) -> str:
    """sha256 of the canonical JSON of `parts` (dicts with sorted keys)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()
