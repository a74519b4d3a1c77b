"""The manifest: what an artifact is, where it came from, and the sha256 of every file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

SCHEMA_VERSION = 1
KINDS = ("dataset", "tokenizer", "model", "reward_model", "eval", "decision")


@dataclass(frozen=True, kw_only=True)
class Manifest:
    schema_version: int = SCHEMA_VERSION
    kind: str
    """One of KINDS."""
    id: str
    """hashing.artifact_id: sha256 over the kind, the files' (relative path, sha256) pairs and the sorted
    parent ids (artifacts stored before parents counted have the files' content hash as their id)."""
    name: str
    created: str
    """UTC ISO-8601 time of the first write."""
    run_id: str
    parents: list[str] = field(default_factory=list)
    """Ids of the artifacts this one was made from."""
    config: dict = field(default_factory=dict)
    """The config part that produced it."""
    code: dict = field(default_factory=dict)
    """Package version, git commit, dirty flag."""
    environment: dict = field(default_factory=dict)
    """Library versions, world size, device."""
    metrics: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    """Anything else worth tracing, e.g. a reward function's import path and source hash."""
    files: dict = field(default_factory=dict)
    """{relative path: {"sha256": hex, "size": bytes}}."""

    @property
    def stage(self) -> str:
        """What made the artifact: its kind, or for a model the stage that stored it (`extra["stage"]`: base or
        sft; RL checkpoints record their `policy_version` instead); "model" when neither says."""
        if self.kind != "model":  # an eval of a reward model says so (eval_pairs); pairs datasets say "pairs"
            return self.extra.get("stage", self.kind) if self.kind in ("eval", "dataset") else self.kind
        return "rl" if "policy_version" in self.extra else self.extra.get("stage", "model")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        if data.get("schema_version", 0) > SCHEMA_VERSION:
            raise ValueError(f"manifest schema_version {data['schema_version']} is newer than this code "
                             f"({SCHEMA_VERSION}); upgrade posttrain")
        return cls(**data)
