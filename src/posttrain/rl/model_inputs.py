"""The models RL roles read through settings (`reward.models`, `rl.critic_init`, ...) as stored artifacts.

Each value - an artifact id (or unique prefix), a local HF folder, or `channel:NAME` - is stored by content
(`models/refs.py::model_ref`: the same files always give the same id) before the run, so that the RL stage's cache
key and its model's lineage name every model by id, and the role's workers get the stored folder. Which
settings read models is declared by each role's registry row (`RoleSpec.reads_models`), so a new role that
reads a model changes nothing here or in `stages.rl`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from posttrain.artifacts import ArtifactRef, ArtifactStore
from posttrain.config import RewardConfig, RLConfig
from posttrain.models.folders import model_folder
from posttrain.models.refs import model_ref
from posttrain.rl.roles.registry import ROLES


@dataclass(frozen=True, kw_only=True)
class RoleModels:
    """The settings twice over - the models named by id (for the cache key) and by stored folder (for the
    workers) - and the models themselves (lineage parents)."""

    rl_ids: RLConfig
    reward_ids: RewardConfig
    rl: RLConfig
    """rl with every model setting holding its stored folder."""
    reward: RewardConfig
    """reward likewise."""
    refs: dict[str, ArtifactRef]
    """Setting ("reward.models[0]", "rl.critic_init") -> the stored model, in ROLES order."""


def resolve(rl_cfg: RLConfig, reward: RewardConfig, *, run_id: str, store: ArtifactStore) -> RoleModels:
    """Store every model a role reads (ROLES' `reads_models`) and return the settings naming them by id and by
    folder. A setting that names nothing ("" or []) stays as it is."""
    by_id: dict[str, object] = {"rl": rl_cfg, "reward": reward}
    by_folder = dict(by_id)
    refs: dict[str, ArtifactRef] = {}
    for spec in ROLES.values():
        for ms in spec.reads_models:
            value = getattr(by_id[ms.section], ms.field)
            many = isinstance(value, (list, tuple))
            values = list(value) if many else [value] if value else []
            names = [f"{ms.name}[{i}]" for i in range(len(values))] if many else [ms.name] * len(values)
            got = [model_ref(v, n, run_id=run_id, store=store, kinds=ms.kinds) for v, n in zip(values, names)]
            refs.update(zip(names, got))
            ids, folders = [r.id for r in got], [str(model_folder(store, r)) for r in got]
            by_id[ms.section] = replace(by_id[ms.section], **{ms.field: ids if many else (ids or [""])[0]})
            by_folder[ms.section] = replace(by_folder[ms.section], **{ms.field: folders if many else (folders or [""])[0]})
    return RoleModels(rl_ids=by_id["rl"], reward_ids=by_id["reward"], rl=by_folder["rl"], reward=by_folder["reward"],
                      refs=refs)
