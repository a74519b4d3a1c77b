"""Which model a setting names, as a stored `model` artifact: `model.base_path` / `model.artifact` (the model a run
starts from) and the settings that take "an artifact id (or unique prefix), a local HF folder, or `channel:NAME`"
(dpo.reference, distill.teacher). A folder is stored by content - the same files always give the same id and are
copied into the store only once - and a channel resolves to the model it holds when the run starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from posttrain.artifacts import ArtifactRef, ArtifactStore
from posttrain.config import ConfigError, ModelConfig


def start_model(model: ModelConfig, *, run_id: str, store: ArtifactStore | None = None) -> ArtifactRef | None:
    """The model a run starts from, as a `model` artifact: `model.artifact` looked up in the store (an id, a
    unique prefix, or `channel:NAME` - the model that channel holds now), or the `model.base_path` folder stored
    as an artifact - by content, so the same folder always gives the same id and is copied into the store only
    once (a later call re-hashes it, which notices an edited file, and copies nothing). None for a from-scratch
    model (neither is set)."""
    store = store or ArtifactStore()
    if model.artifact:
        return _stored_model(model.artifact, "model.artifact", store)
    if not model.base_path:
        return None
    return _folder_model(model.base_path, "model.base_path", run_id, store)


def model_ref(spec: str, setting: str, *, run_id: str, store: ArtifactStore | None = None,
              kinds: tuple[str, ...] = ("model",)) -> ArtifactRef:
    """A model named by a setting that takes "an artifact id (or unique prefix), a local HF folder, or
    `channel:NAME`" (dpo.reference, distill.teacher, reward.models): a folder is stored by content like
    model.base_path; a stored artifact must be one of `kinds` (reward.models also takes `reward_model`s)."""
    store = store or ArtifactStore()
    if not spec.startswith("channel:") and (os.sep in spec or spec.startswith((".", "~")) or Path(spec).is_dir()):
        return _folder_model(spec, setting, run_id, store)
    return _stored_model(spec, setting, store, kinds)


def _stored_model(spec: str, setting: str, store: ArtifactStore, kinds: tuple[str, ...] = ("model",)) -> ArtifactRef:
    from posttrain.artifacts import ArtifactNotFoundError

    artifact = _from_channel(spec, store, setting)
    try:
        ref = store.ref(artifact)
    except ArtifactNotFoundError as e:
        raise ArtifactNotFoundError(f"{setting}: {e}") from None
    if ref.kind not in kinds:
        raise ConfigError(f"{setting}: {spec!r} is a {ref.kind} artifact ({ref.short} {ref.name}), not "
                          + " or ".join(f"a {k}" for k in kinds))
    print(f"{setting}: model artifact {ref.short} ({ref.name})")
    return ref


def _folder_model(path: str, setting: str, run_id: str, store: ArtifactStore) -> ArtifactRef:
    base = Path(os.path.abspath(os.path.expanduser(path)))
    if not base.is_dir():
        raise FileNotFoundError(f"{setting}: {base} is not a folder (expected a local HF model folder)")
    if not any(base.glob("*.safetensors")):
        raise FileNotFoundError(f"{setting}: {base} holds no *.safetensors weights (only safetensors are "
                                f"loaded; convert other formats first)")
    ref = store.put("model", f"base-{base.name}", base, run_id=run_id, parents=[], config={"base_path": str(base)},
                    extra={"stage": "base"})
    print(f"{setting}: {base} -> model artifact {ref.short}")
    return ref


def _from_channel(artifact: str, store: ArtifactStore, setting: str = "model.artifact") -> str:
    """`channel:NAME` -> the id of the model the channel holds (ConfigError when it holds none); else as given."""
    if not artifact.startswith("channel:"):
        return artifact
    from posttrain.promotion import current

    name = artifact.removeprefix("channel:")
    held = current(name, store)
    if held is None:
        raise ConfigError(f"{setting}: {artifact!r}: channel {name!r} holds no model yet in {store.root} (no "
                          f"promotion so far); start from a model id or base_path for the first run")
    print(f"{setting}: channel {name} holds model {held['model_id'][:12]}")
    return held["model_id"]
