"""Config: validation names the field, overrides merge, recipes are valid, and flytekit's type engine
passes the frozen dataclasses (enums, optionals, nested parts) both ways unchanged."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import (
    Algorithm,
    ConfigError,
    DataConfig,
    LossAgg,
    PipelineConfig,
    PlacementMode,
    RLConfig,
    apply_overrides,
    from_dict,
    to_dict,
    validate,
)
from posttrain.recipes import RECIPES, resolve


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_is_valid(name):
    cfg = resolve(name)
    assert cfg.name == name


def test_overrides_change_one_field_and_keep_the_rest():
    base = resolve("tiny_cpu")
    cfg = resolve("tiny_cpu", '{"sft": {"steps": 70}, "placement": {"mode": "split"}}')
    assert cfg.sft.steps == 70 and cfg.placement.mode is PlacementMode.SPLIT
    assert cfg.sft.lr == base.sft.lr and cfg.data == base.data


@pytest.mark.parametrize("overrides, field", [
    ('{"sft": {"steps": 0}}', "sft.steps"),
    ('{"sft": {"tokens": 100000}}', "sft.steps"),  # a token budget AND steps: one of them would do nothing
    ('{"sft": {"steps": 0, "tokens": -5}}', "sft.tokens"),
    ('{"sft": {"global_batch_size": 63}}', "sft.global_batch_size"),
    ('{"sft": {"lr": "fast"}}', "sft.lr"),
    ('{"rl": {"kl_estimator": "k9"}}', "rl.kl_estimator"),
    ('{"rl": {"samples_per_prompt": 1}}', "rl.samples_per_prompt"),
    ('{"rl": {"gamma": 0.9}}', "rl.gamma"),  # a PPO setting under GRPO does nothing: refused
    ('{"rl": {"algorithm": "ppo", "critic_warmup_steps": 100}}', "rl.critic_warmup_steps"),
    ('{"rl": {"algorithm": "ppo", "clip_ratio_c": 0.5}}', "rl.clip_ratio_c"),
    ('{"rl": {"algorithm": "ppo", "kl_in_reward": true}}', "rl.kl_in_reward"),
    ('{"placement": {"critic_workers": 2}}', "placement.critic_workers"),
    ('{"rl": {"mini_batches": 2000}}', "rl.mini_batches"),
    ('{"reward": {"fn": "not a path"}}', "reward.fn"),
    ('{"rl": {"max_new_tokens": 32}}', "rl.max_new_tokens"),
    ('{"eval": {"max_new_tokens": 40}}', "eval.max_new_tokens"),
    ('{"sft": {"enabled": false}}', "sft.enabled"),
    ('{"model": {"base_path": "/m", "artifact": "abc"}, "data": {"tokenizer": {"train": false}}}', "model.artifact"),
    ('{"model": {"base_path": "/m"}}', "data.tokenizer.train"),
    ('{"data": {"eval_files": ["/e.jsonl"]}}', "data.eval_files"),
    ('{"data": {"task": "", "files": ["/t.jsonl"], "eval_files": ["/e.jsonl"]}}', "data.eval_size"),
    ('{"data": {"demo_error_rate": 1.0}}', "data.demo_error_rate"),
    ('{"data": {"task": "chain", "demo_error_rate": 0.5}}', "data.demo_error_rate"),
    ('{"rl": {"max_reward_failure_rate": 1.5}}', "rl.max_reward_failure_rate"),
    ('{"rl": {"top_p": 0}}', "rl.top_p"),
    ('{"eval": {"top_k": -1}}', "eval.top_k"),
    ('{"model": {"num_heads": 3}}', "model.num_heads"),
    ('{"data": {"task": "sorting"}}', "data.task"),
    ('{"data": {"task": "", "files": []}}', "data.files"),
    ('{"data": {"tokenizer": {"train": false}}}', "data.tokenizer.train"),
    ('{"tracking": {"wandb_mode": "loud"}}', "tracking.wandb_mode"),
    ('{"tracking": {"wandb_mode": "disabled"}}', "tracking.wandb"),
    ('{"rl": {"warmup_steps": -1}}', "rl.warmup_steps"),
    ('{"eval": {"k": -1}}', "eval.k"),
    ('{"placement": {"policy_workers": 0}}', "placement.policy_workers"),
    ('{"placement": {"torch_threads": 0}}', "placement.torch_threads"),
    ('{"placement": {"rollout_threads": -1}}', "placement.rollout_threads"),
    ('{"placement": {"malloc_arena_max": -1}}', "placement.malloc_arena_max"),
    ('{"rl": {"prompts_per_step": 1, "samples_per_prompt": 2}, "placement": {"policy_workers": 4}}',
     "rl.prompts_per_step"),
    ('{"rl": {"episode": {"max_turns": 2}}}', "rl.episode.max_turns"),  # does nothing without an environment
    ('{"placement": {"environment_workers": 2}}', "placement.environment_workers"),
    ('{"rl": {"environment": "not a path"}}', "rl.environment"),
    ('{"rl": {"tools": ["pkg.mod:fn", "pkg.mod"]}}', "rl.tools[1]"),
    ('{"rl": {"environment": "posttrain.envs.builtin:Calculator"}}', "rl.episode.max_total_tokens"),  # 256 > tiny_cpu's 32
    ('{"rl": {"environment": "posttrain.envs.builtin:Calculator", "episode": {"max_total_tokens": 4}}}', "rl.episode.max_total_tokens"),
    (('{"rl": {"environment": "posttrain.envs.builtin:Calculator", "parallelism": "fsdp2", "episode": '
      '{"max_total_tokens": 24}}, "placement": {"rollout_workers": 0, "policy_workers": 2}}'), "placement.rollout_workers"),
    ('{"eval": {"episode": {"max_turns": 2}}}', "eval.episode.max_turns"),  # eval's episodes: the same checks
    ('{"eval": {"tools": ["pkg.mod"]}}', "eval.tools[0]"),
    ('{"eval": {"environment": "posttrain.envs.builtin:Calculator"}}', "eval.episode.max_total_tokens"),
    ('{"rl": {"environment": "posttrain.envs.builtin:Calculator", "episode": {"max_total_tokens": 24, "max_turns": 0}}}',
     "rl.episode.max_turns"),
    (('{"rl": {"algorithm": "dapo", "overlong_buffer": 2, "environment": "posttrain.envs.builtin:Calculator", '
     '"episode": {"max_total_tokens": 24}}}'), "rl.overlong_buffer"),
    ('{"sft": {"stepz": 3}}', "sft"),
    ('{"sft": ', "overrides"),
])
def test_invalid_values_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as e:
        resolve("tiny_cpu", overrides)
    assert str(e.value).startswith(field), str(e.value)


def test_an_environment_may_be_the_whole_reward():
    """rl.environment with reward.fn_weight 0: the environment's own rewards are the reward (whether it gives any
    is checked when its workers start, roles.episode_rollout.compose)."""
    cfg = resolve("tiny_cpu", '{"rl": {"environment": "posttrain.envs.builtin:Calculator", "episode": {"max_total_tokens": 24}}, '
                              '"reward": {"fn_weight": 0}}')
    assert cfg.rl.environment == "posttrain.envs.builtin:Calculator" and cfg.rl.episode.max_total_tokens == 24 and cfg.reward.fn_weight == 0


def test_removed_setting_is_refused_with_what_to_do_instead():
    """sft.epochs_limit was accepted and never read; an override that still sets it must fail, saying so."""
    with pytest.raises(ConfigError) as e:
        resolve("tiny_cpu", '{"sft": {"epochs_limit": 1}}')
    assert str(e.value).startswith("sft.epochs_limit: this setting was removed"), str(e.value)
    assert "sft.steps" in str(e.value)


def test_unknown_recipe_lists_the_allowed_ones():
    with pytest.raises(ConfigError, match="tiny_cpu"):
        resolve("huge")


def test_dict_round_trip_preserves_enums_and_lists():
    cfg = validate(apply_overrides(PipelineConfig(), {"rl": {"loss_agg": "seq_mean"}}))
    again = from_dict(PipelineConfig, to_dict(cfg))
    assert again == cfg and again.rl.loss_agg is LossAgg.SEQ_MEAN


def test_configs_are_frozen():
    cfg = PipelineConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.sft.steps = 3  # type: ignore[misc]


def _roundtrip(value, tp):
    from flytekit.core.context_manager import FlyteContextManager
    from flytekit.core.type_engine import TypeEngine

    ctx = FlyteContextManager.current_context()
    lt = TypeEngine.to_literal_type(tp)
    lit = TypeEngine.to_literal(ctx, value, tp, lt)
    return TypeEngine.to_python_value(ctx, lit, tp)


@pytest.mark.parametrize("part", [f.name for f in dataclasses.fields(PipelineConfig) if f.name != "name"])
def test_type_engine_round_trip_of_every_part(part):
    cfg = resolve("tiny_cpu", '{"rl": {"algorithm": "grpo", "loss_agg": "seq_mean"}, "placement": {"mode": "split"}}')
    value = getattr(cfg, part)
    back = _roundtrip(value, type(value))
    assert back == value and type(back) is type(value)
    for f in dataclasses.fields(value):  # enums come back as enums, not strings
        assert type(getattr(back, f.name)) is type(getattr(value, f.name))


def test_type_engine_round_trip_of_whole_pipeline_and_optional_handle():
    cfg = resolve("tiny_chain", '{"data": {"files": [], "task": "chain"}}')
    assert _roundtrip(cfg, PipelineConfig) == cfg
    ref = ArtifactRef(kind="dataset", id="ab" * 32, name="x", store="/tmp/s")
    # typing.Optional is a runtime value here, not an annotation: Flyte's TypeEngine is asked about that exact
    # object (`ArtifactRef | None` is a different one, types.UnionType), so UP045's rewrite would change the test.
    assert _roundtrip(ref, typing.Optional[ArtifactRef]) == ref  # noqa: UP045 (runtime value; see above)
    assert _roundtrip(None, typing.Optional[ArtifactRef]) is None  # noqa: UP045 (runtime value; see above)
    assert _roundtrip(RLConfig(algorithm=Algorithm.GRPO), RLConfig).algorithm is Algorithm.GRPO


def test_file_data_config_round_trips_with_its_list():
    d = DataConfig(task="", files=["a.jsonl", "b.jsonl"])
    assert _roundtrip(d, DataConfig).files == ["a.jsonl", "b.jsonl"]


def test_generation_threads_default_to_torch_threads():
    from posttrain.config import PlacementConfig

    assert PlacementConfig(torch_threads=3).generation_threads == 3
    assert PlacementConfig(torch_threads=1, rollout_threads=2).generation_threads == 2


@pytest.mark.parametrize("overrides, message", [
    ({"dpo": {"beta": 0}}, "dpo.beta: must be > 0"),
    ({"dpo": {"loss": "ipo", "label_smoothing": 0.1}}, "dpo.label_smoothing: only applies to the 'sigmoid' loss"),
    ({"dpo": {"loss": "kto"}}, "dpo.loss"),
    ({"distill": {"loss": "jsd", "beta": 1.0}}, "distill.beta: must be in (0, 1)"),
    ({"distill": {"beta": 0.3}}, "distill.beta: only applies to the 'jsd' loss"),
    ({"distill": {"temperature": 0}}, "distill.temperature: must be > 0"),
    ({"reward_model": {"global_batch_size": 48}}, "reward_model.global_batch_size: must be a multiple"),
    ({"pairs": {"samples_per_prompt": 1}}, "pairs.samples_per_prompt: must be >= 2"),
    ({"pairs": {"max_new_tokens": 40}}, "pairs.max_new_tokens: must be < model.max_seq_len"),
    ({"dpo": {"nproc": 3}}, "dpo.nproc: must equal sft.nproc = 2"),
])
def test_dense_sections_are_checked_naming_the_field(overrides, message):
    with pytest.raises(ConfigError) as e:
        resolve("tiny_cpu", overrides)
    assert str(e.value).startswith(message.split(":")[0]) and message in str(e.value)


def test_dense_sections_follow_sft_nproc_and_are_checked_only_where_used():
    """nproc 0 means sft.nproc (one Elastic group); a 4-rank SFT run need not fit DPO's batch, dpo_pipeline must."""
    four = {"sft": {"nproc": 4, "micro_batch_size": 32}}
    cfg = resolve("tiny_cpu", four, workflow="pipeline")
    assert cfg.dpo.nproc == cfg.reward_model.nproc == cfg.distill.nproc == 4
    with pytest.raises(ConfigError, match=r"dpo.global_batch_size: must be a multiple of .* = 128"):
        resolve("tiny_cpu", four, workflow="dpo_pipeline")
    resolve("tiny_cpu", {**four, "dpo": {"micro_batch_size": 16}}, workflow="dpo_pipeline")
    resolve("tiny_cpu", {"dpo": {"beta": 0}}, workflow="distill_pipeline")  # DPO is not distill_pipeline's concern


def test_the_objective_is_the_sections_class():
    from posttrain.config import Objective, objective_of

    cfg = resolve("tiny_cpu")
    assert [objective_of(getattr(cfg, s)) for s in ("sft", "dpo", "reward_model", "distill")] == [
        Objective.SFT, Objective.DPO, Objective.REWARD_MODEL, Objective.DISTILL]
