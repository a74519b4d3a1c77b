"""`placement.rollout_workers: 0` on real workers in-process (a tiny Llama, a gloo group of one): the policy ranks
generate the rollouts with their own model (rollout.PolicyRollout) - no rollout worker, no weight transfer.
Full fine-tuning gives exactly the run that a separate rollout worker gives (same samples and rewards at every
step, the same weights at the end); with LoRA the policy generates through its adapters and learns, with every
sync's report carrying the checksum of the weights it generated with; settings it cannot serve are refused."""

from __future__ import annotations

import pytest
import torch

from posttrain.config import ModelConfig, PlacementConfig, RLConfig
from posttrain.models.io import load_tokenizer
from posttrain.rl.remote import LocalActor
from tests.unit.test_rl_lora import MODEL as LORA
from tests.unit.test_rl_mismatch import EvenTokens
from tests.unit.test_rl_pg_family import _examples

CFG = RLConfig(steps=6, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=4, lr=3e-2, checkpoint_every=0,
               micro_batch_size=32, seed=0, kl_coef=0.0)


class Recorder:
    """The rollout group, passed through: keeps every batch it generated."""

    def __init__(self, group):
        self.group, self.batches = group, []

    def generate(self, prompts, **kw):
        out = self.group.generate(prompts, **kw)
        self.batches.append(out)
        return out

    def __getattr__(self, name):
        return getattr(self.group, name)


def _run(folders, cfg: RLConfig, model: ModelConfig, *, generates: bool) -> dict:
    from posttrain.config import RewardConfig
    from posttrain.rl.controller import Controller
    from posttrain.rl.roles.composed import served_by_policy
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.roles.policy_group import PolicyGroup
    from posttrain.rl.roles.registry import RunSettings
    from posttrain.rl.roles.rollout import RolloutGroup, RolloutWorker
    from posttrain.rl.state import PromptSampler
    from tests.rl_fakes import NullTracker

    md = str(folders["llama"])
    policy = PolicyWorker(md, cfg, 0, 1, model)
    pg = PolicyGroup([LocalActor(policy)], [policy.identity()], 60, cfg.micro_batch_size, seed=cfg.seed,
                     generates=generates)
    pg.setup()
    groups = {"reward": EvenTokens(), "policy": pg}
    if not generates:
        worker = RolloutWorker(md, 0, 1)
        groups["rollout"] = RolloutGroup([LocalActor(worker)], [worker.identity()], 60)
    settings = RunSettings(rl=cfg, reward=RewardConfig(), placement=PlacementConfig(rollout_workers=0 if generates else 1),
                           model=model, start_model_dir=md)
    groups.update(served_by_policy(settings, groups))
    groups["rollout"] = rec = Recorder(groups["rollout"])
    sampler = PromptSampler(_examples(), load_tokenizer(md), prompts_per_step=cfg.prompts_per_step, seed=cfg.seed)
    history = Controller(cfg, groups, sampler, NullTracker(), None).run(cfg.steps)
    return {"history": history, "policy": policy, "group": pg, "rollout": rec, "groups": groups}


def test_full_fine_tuning_generating_in_the_policy_is_the_same_run_as_with_a_rollout_worker(folders, world_of_one):
    from posttrain.rl.roles.rollout import PolicyRollout

    apart = _run(folders, CFG, ModelConfig(), generates=False)
    together = _run(folders, CFG, ModelConfig(), generates=True)
    assert isinstance(together["rollout"].group, PolicyRollout)
    assert together["rollout"].group.workers == together["group"].workers  # the policy's own actors generate
    for a, b in zip(apart["rollout"].batches, together["rollout"].batches, strict=True):
        assert a.policy_version == b.policy_version and a.response_ids == b.response_ids
        assert torch.allclose(torch.tensor([x for r in a.logprobs for x in r]),
                              torch.tensor([x for r in b.logprobs for x in r]), atol=1e-6)
    assert [m.reward_mean for m in apart["history"]] == [m.reward_mean for m in together["history"]]
    assert apart["policy"].checksum() == together["policy"].checksum()
    assert together["policy"].version == CFG.steps


def test_with_lora_the_policy_generates_through_its_adapters_and_learns(folders, world_of_one):
    from posttrain.rl.weight_sync import weights_checksum

    cfg = RLConfig(**{**CFG.__dict__, "steps": 12, "kl_coef": 0.01})
    run = _run(folders, cfg, LORA, generates=True)
    h, policy = run["history"], run["policy"]
    assert run["groups"]["reference"].workers == run["group"].workers and policy.version == cfg.steps
    assert [b.policy_version for b in run["rollout"].batches] == list(range(cfg.steps))
    first, last = sum(m.reward_mean for m in h[:3]) / 3, sum(m.reward_mean for m in h[-3:]) / 3
    assert last > first + 0.3, [round(m.reward_mean, 3) for m in h]  # as with a rollout worker: 0.53 -> 1.00
    assert max(m.drift for m in h) < 1e-5
    report = run["policy"].load_weights(None, cfg.steps)  # what the sync checks: the held weights
    assert report.version == cfg.steps and report.checksum == policy.checksum()
    assert report.checksum == weights_checksum(policy._rollout_weights())
    with pytest.raises(RuntimeError, match="holds policy version 12, not 11"):
        run["policy"].load_weights(None, 11)


@pytest.mark.parametrize("overrides, field, message", [
    ({"placement": {"rollout_workers": 0}, "rl": {"rollout_backend": "vllm"}}, "placement.rollout_workers",
     "needs rl.rollout_backend 'transformers'"),
    ({"placement": {"rollout_workers": 0, "mode": "split"}}, "placement.mode", "the policy ranks generate"),
    ({"placement": {"rollout_workers": -1}}, "placement.rollout_workers", "must be >= 0"),
    ({"rl": {"policy_generate_batch": 16}}, "rl.policy_generate_batch", "but placement.rollout_workers is 1"),
    ({"placement": {"rollout_workers": 0}, "rl": {"policy_generate_batch": -1}}, "rl.policy_generate_batch",
     "must be >= 0"),
])
def test_settings_the_policy_cannot_generate_with_are_refused(overrides, field, message, monkeypatch):
    from posttrain.config import ConfigError, check_base
    from posttrain.recipes import resolve

    monkeypatch.setattr(check_base, "vllm_installed", lambda: True)  # the refusal is not about the install
    with pytest.raises(ConfigError, match=field) as e:
        resolve("tiny_cpu", overrides)
    assert message in str(e.value)


def test_with_rollout_workers_0_no_rollout_workers_start():
    from posttrain.recipes import resolve
    from posttrain.rl.roles.registry import RunSettings, role_counts

    cfg = resolve("tiny_cpu", {"placement": {"rollout_workers": 0}})
    s = RunSettings(rl=cfg.rl, reward=cfg.reward, placement=cfg.placement, model=cfg.model, start_model_dir="x")
    assert "rollout" not in role_counts(s) and role_counts(s)["policy"] == 2
    assert PlacementConfig().rollout_workers == 1  # separate rollout workers stay the default


def test_policy_generate_batch_bounds_the_rows_a_policy_rank_generates_at_once(folders, world_of_one, monkeypatch):
    """rl.policy_generate_batch reaches the policy rank's generate (its KV cache holds that many rows at a time);
    the run is otherwise as before: every step's rollout has all of its rows, from the right version."""
    from posttrain.models import generate as gen_module
    from posttrain.rl.roles import policy_weights

    seen = []

    def spy(*args, batch_size, **kw):
        seen.append(batch_size)
        return gen_module.generate(*args, batch_size=batch_size, **kw)

    monkeypatch.setattr(policy_weights, "generate", spy)
    cfg = RLConfig(**{**CFG.__dict__, "steps": 3, "policy_generate_batch": 8})
    run = _run(folders, cfg, ModelConfig(), generates=True)
    assert seen == [8] * cfg.steps
    assert [len(b.response_ids) for b in run["rollout"].batches] == [cfg.prompts_per_step * cfg.samples_per_prompt] * 3
    assert [b.policy_version for b in run["rollout"].batches] == [0, 1, 2]
