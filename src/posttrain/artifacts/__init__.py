"""Content-addressed artifacts with manifests and lineage (see store.py)."""

from posttrain.artifacts.errors import (
    ArtifactError,
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    StoreConfigError,
)
from posttrain.artifacts.handles import ArtifactRef
from posttrain.artifacts.manifest import Manifest
from posttrain.artifacts.store import ArtifactStore, LineageNode, default_root

__all__ = ["ArtifactError", "ArtifactIntegrityError", "ArtifactNotFoundError", "ArtifactRef", "ArtifactStore",
           "LineageNode", "Manifest", "StoreConfigError", "default_root"]
