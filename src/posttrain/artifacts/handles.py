"""The small typed handle that Flyte tasks pass between each other instead of folders.

Locally Flyte does not upload a FlyteDirectory (its cache stores a /tmp path), so a task hands the next one
an `ArtifactRef`: the store URI and the content id. The receiver resolves it through `ArtifactStore.get`,
which verifies the hashes. The same handle works on a cluster with an s3:// or gs:// store.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ArtifactRef:
    kind: str
    """One of "dataset", "tokenizer", "model", "eval"."""
    id: str
    """sha256 (hex) of the artifact's content: its files' relative paths and hashes."""
    name: str
    """Human-readable name, e.g. "addition" or "sft-tiny_cpu"."""
    store: str
    """Root URI of the artifact store that holds it (a local path or an fsspec URL)."""

    @property
    def short(self) -> str:
        return self.id[:12]
