"""The models RL roles read through settings (registry `reads_models`: reward.models, rl.critic_init) are stored
by content before the run: the cache key's settings name them by id, the workers get the stored folder, and the
RL model's lineage lists them; settings that name no model are left exactly as they were (so the default's
cache keys do not move), and a stored artifact of the wrong kind is refused naming the setting."""

from __future__ import annotations

from dataclasses import replace

import pytest

from posttrain.artifacts import ArtifactStore
from posttrain.config import Algorithm, ConfigError, RewardConfig, RLConfig
from posttrain.rl import model_inputs


def test_every_model_a_role_reads_is_stored_and_named_by_id(folders, tmp_path):
    store = ArtifactStore(tmp_path / "store")
    rl = RLConfig(algorithm=Algorithm.PPO, critic_init=str(folders["llama"]))
    reward = RewardConfig(models=[str(folders["llama"]), str(folders["tiny"])], model_weights=[1.0, 0.5])
    got = model_inputs.resolve(rl, reward, run_id="t", store=store)
    assert list(got.refs) == ["reward.models[0]", "reward.models[1]", "rl.critic_init"]  # ROLES order
    llama, tiny = got.refs["reward.models[0]"], got.refs["reward.models[1]"]
    assert got.refs["rl.critic_init"].id == llama.id  # the same files: stored once, one id
    assert got.reward_ids.models == [llama.id, tiny.id] and got.rl_ids.critic_init == llama.id
    assert got.reward.models == [str(store.get(llama)), str(store.get(tiny))]
    assert got.rl.critic_init == str(store.get(llama)) and (store.get(llama) / "config.json").is_file()
    assert got.reward.model_weights == [1.0, 0.5] and got.rl.lr == rl.lr  # nothing else changes
    # an id resolves to itself: what a workflow passes (rlhf_pipeline's trained reward model)
    again = model_inputs.resolve(replace(rl, critic_init=llama.id), RewardConfig(), run_id="t", store=store)
    assert again.rl_ids.critic_init == llama.id and list(again.refs) == ["rl.critic_init"]


def test_settings_naming_no_model_stay_as_they_are(tmp_path):
    rl, reward = RLConfig(), RewardConfig()
    got = model_inputs.resolve(rl, reward, run_id="t", store=ArtifactStore(tmp_path / "store"))
    assert got.rl_ids == rl and got.reward_ids == reward and got.rl == rl and got.refs == {}


def test_a_stored_artifact_of_another_kind_is_refused_naming_the_setting(folders, tmp_path):
    store = ArtifactStore(tmp_path / "store")
    ds = store.put("dataset", "d", folders["llama"], run_id="t", parents=[], config={})
    with pytest.raises(ConfigError, match=r"rl\.critic_init: .* is a dataset artifact"):
        model_inputs.resolve(RLConfig(algorithm=Algorithm.PPO, critic_init=ds.id), RewardConfig(), run_id="t",
                             store=store)


def test_the_teacher_of_on_policy_distillation_is_stored_for_lineage(folders, tmp_path):
    store = ArtifactStore(tmp_path / "store")
    rl = RLConfig(algorithm=Algorithm.ON_POLICY_DISTILL, teacher=str(folders["tiny"]))
    got = model_inputs.resolve(rl, RewardConfig(), run_id="t", store=store)
    assert list(got.refs) == ["rl.teacher"] and got.rl_ids.teacher == got.refs["rl.teacher"].id
    assert got.rl.teacher == str(store.get(got.refs["rl.teacher"]))
