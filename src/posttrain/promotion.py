"""Channels and the promotion gate: a channel ("production") is a pointer file in the store naming a model
artifact and the eval artifact that justified it. `gate` moves the pointer only when the candidate's greedy
accuracy reaches the bar and is not worse than the current holder's - so a scheduled retrain can never
silently replace a better model with a worse one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import fsspec

from posttrain.artifacts import ArtifactStore
from posttrain.artifacts.handles import ArtifactRef


@dataclass(frozen=True, kw_only=True)
class Decision:
    promoted: bool
    reason: str


def _pointer(store: ArtifactStore, channel: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, root = fsspec.core.url_to_fs(str(store.root))
    return fs, f"{root.rstrip('/')}/channels/{channel}.json"


def current(channel: str, store: ArtifactStore | None = None) -> dict | None:
    """The channel's pointer {"model_id", "eval_id", "greedy_accuracy"}, or None if never promoted."""
    store = store or ArtifactStore()
    fs, path = _pointer(store, channel)
    if not fs.exists(path):
        return None
    with fs.open(path, "r") as f:
        return json.load(f)


def gate(*, channel: str, model: ArtifactRef, eval_report: ArtifactRef, min_accuracy: float,
         store: ArtifactStore | None = None) -> Decision:
    store = store or ArtifactStore()
    ev = store.manifest(eval_report.id)
    if model.id not in ev.parents:
        raise ValueError(f"eval {eval_report.short} was not made from model {model.short} (its parents: {ev.parents})")
    acc = float(ev.metrics["greedy_accuracy"])
    if acc < min_accuracy:
        return Decision(promoted=False, reason=f"greedy accuracy {acc:.3f} < min_accuracy {min_accuracy:.3f}")
    held = current(channel, store)
    if held is not None and acc < held["greedy_accuracy"]:
        return Decision(promoted=False, reason=f"greedy accuracy {acc:.3f} < current {channel} model "
                                               f"{held['model_id'][:12]} ({held['greedy_accuracy']:.3f})")
    fs, path = _pointer(store, channel)
    fs.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with fs.open(tmp, "w") as f:
        json.dump({"model_id": model.id, "eval_id": eval_report.id, "greedy_accuracy": acc}, f)
    fs.mv(tmp, path)
    return Decision(promoted=True, reason=f"greedy accuracy {acc:.3f} >= {min_accuracy:.3f}"
                                          + (f" and >= current {held['greedy_accuracy']:.3f}" if held else ""))
