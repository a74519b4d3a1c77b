"""Errors raised by the artifact store; each message names the artifact and, where relevant, the file."""


class ArtifactError(Exception):
    """Base class for artifact-store errors."""


class ArtifactNotFoundError(ArtifactError, KeyError):
    def __str__(self) -> str:  # KeyError would print the repr
        return str(self.args[0]) if self.args else "artifact not found"


class ArtifactIntegrityError(ArtifactError):
    """A file's content does not match the sha256 recorded in the manifest (or a file is missing)."""


class StoreConfigError(ArtifactError):
    """The store root cannot be used here (e.g. a remote run writing to a local default)."""
