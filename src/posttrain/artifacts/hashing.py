"""Hashing: file digests, the content hash over (relpath, digest) pairs, the artifact id, and cache keys."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

CHUNK = 1 << 20


def sha256_stream(f) -> str:
    h = hashlib.sha256()
    while chunk := f.read(CHUNK):
        h.update(chunk)
    return h.hexdigest()


def content_id(files: Iterable[tuple[str, str]]) -> str:
    """The content hash: sha256 over the sorted (relative path, file sha256) pairs. (Until ids covered the
    parents, this was the artifact id; artifacts stored then keep it as their id.)"""
    h = hashlib.sha256()
    for rel, digest in sorted(files):
        h.update(rel.encode() + b"\0" + digest.encode() + b"\n")
    return h.hexdigest()


def artifact_id(kind: str, files: Iterable[tuple[str, str]], parents: Iterable[str]) -> str:
    """The artifact id: sha256 over the kind, the content hash of the files and the sorted, distinct parent
    ids. The same bytes made from other inputs are another artifact (lineage stays right); the same bytes from
    the same inputs are the same artifact, whatever the order the parents are given in (puts are idempotent)."""
    h = hashlib.sha256(b"posttrain-artifact-v2\n")
    h.update(kind.encode() + b"\n" + content_id(files).encode() + b"\n")
    for parent in sorted(set(parents)):
        h.update(parent.encode() + b"\n")
    return h.hexdigest()


def cache_key(*parts: Any) -> str:
    """sha256 of the canonical JSON of `parts` (dicts with sorted keys)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()
