"""The policy-gradient family's loops (rl.algorithm rloo, dr_grpo, gspo, reinforce_pp) on real workers in-process
(a tiny Llama, a gloo group of one): each step hands the policy exactly its estimator's advantages of that
step's rewards and its own objective (GSPO's sequence-level ratio, Dr. GRPO's constant normaliser), the update
applies and moves the weights; REINFORCE++ puts the KL to the reference into the token rewards, not the loss.
The estimators' math against verl is tests/unit/test_pg_family_verl.py; learning curves are bench/algorithms.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from posttrain.config import Algorithm, LossAgg, RewardConfig, RLConfig
from posttrain.models.io import load_tokenizer
from posttrain.rl.algorithms.grpo import group_advantages, kl_penalty
from posttrain.rl.algorithms.pg import reinforce_pp_returns, rloo_advantages
from posttrain.rl.algorithms.ppo import token_rewards
from posttrain.rl.loops.common import pad_rows, response_mask
from posttrain.rl.remote import LocalActor
from posttrain.rl.types import PolicyLoss

BASE = RLConfig(steps=2, prompts_per_step=4, samples_per_prompt=4, max_new_tokens=4, lr=1e-3, checkpoint_every=0,
                micro_batch_size=8, seed=0, temperature=1.5)
CASES = {
    "rloo": (replace(BASE, algorithm=Algorithm.RLOO), PolicyLoss.CLIP, None),
    "dr_grpo": (replace(BASE, algorithm=Algorithm.DR_GRPO), PolicyLoss.CLIP, LossAgg.SEQ_MEAN_TOKEN_SUM_NORM),
    "gspo": (replace(BASE, algorithm=Algorithm.GSPO, clip_low=3e-4, clip_high=4e-4), PolicyLoss.GSPO, LossAgg.SEQ_MEAN),
    "reinforce_pp": (replace(BASE, algorithm=Algorithm.REINFORCE_PP, kl_coef=0.1, gamma=0.9), PolicyLoss.CLIP, None),
}


def _examples():
    return [{"messages": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b),
             "task": "addition"} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (9, 1), (4, 4), (6, 1)]]


class Reward01:
    """Score 1 for an even number of characters, else 0: both values in most groups, so advantages are not 0."""

    weight = 1.0

    def identities(self):
        return []

    def check_arguments(self, columns):
        pass

    def score(self, t):
        from posttrain.rl.types import Rewards

        return Rewards(policy_version=t.policy_version, scores=[float(len(x) % 2 == 0) for x in t.texts],
                       failures=[None] * len(t.texts), scorer="test:even", compute_s=0.0)


def _run(folders, cfg):
    from posttrain.rl.controller import Controller
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.roles.policy_group import PolicyGroup
    from posttrain.rl.roles.reference import ReferenceGroup, ReferenceWorker
    from posttrain.rl.roles.rollout import RolloutGroup, RolloutWorker
    from posttrain.rl.state import PromptSampler
    from tests.rl_fakes import NullTracker

    md = str(folders["llama"])
    rollout, policy = RolloutWorker(md, 0, 1), PolicyWorker(md, cfg, 0, 1)
    pg = PolicyGroup([LocalActor(policy)], [policy.identity()], 60, cfg.micro_batch_size, seed=cfg.seed)
    pg.setup()
    seen = {"batches": [], "rewards": [], "ref": []}
    real_update = pg.update

    def spy(batch, **kw):
        seen["batches"].append(batch)
        return real_update(batch, **kw)

    pg.update = spy
    reward = Reward01()
    real_score = reward.score
    reward.score = lambda t: seen["rewards"].append(real_score(t)) or seen["rewards"][-1]
    groups = {"rollout": RolloutGroup([LocalActor(rollout)], [rollout.identity()], 60), "reward": reward,
              "policy": pg}
    if cfg.kl_coef > 0:
        ref = ReferenceWorker(md, 0, 1, cfg)
        rg = ReferenceGroup([LocalActor(ref)], [ref.identity()], 60)
        real_lp = rg.log_probs
        rg.log_probs = lambda t, **kw: seen["ref"].append(real_lp(t, **kw)) or seen["ref"][-1]
        groups["reference"] = rg
    sampler = PromptSampler(_examples(), load_tokenizer(md), prompts_per_step=cfg.prompts_per_step, seed=cfg.seed)
    before = policy.checksum()
    history = Controller(cfg, groups, sampler, NullTracker(), None).run(cfg.steps)
    return history, seen, before, policy.checksum()


@pytest.mark.parametrize("name", list(CASES))
def test_each_loop_hands_the_policy_its_advantages_and_objective(folders, world_of_one, name):
    cfg, loss, loss_agg = CASES[name]
    history, seen, before, after = _run(folders, cfg)
    assert [m.policy_version for m in history] == [1, 2] and after != before
    n = cfg.samples_per_prompt
    for k, batch in enumerate(seen["batches"]):
        assert batch.loss == loss and batch.loss_agg == loss_agg
        scores = torch.tensor(seen["rewards"][k].scores)
        assert 0 < scores.mean() < 1, "all rewards equal: the test would prove nothing"
        if name == "rloo":
            want = rloo_advantages(scores, n)
        elif name in ("dr_grpo", "gspo"):
            want = group_advantages(scores, n, std_normalize=name == "gspo")
        if name != "reinforce_pp":
            assert torch.allclose(torch.tensor(batch.advantages), want, atol=1e-6)
            continue
        assert batch.ref_logprobs is None  # the KL is in the reward, not in the loss
        mask = response_mask(batch.response_ids)
        kl = kl_penalty(pad_rows(batch.old_logprobs, mask), pad_rows(seen["ref"][k].values, mask), cfg.kl_estimator)
        want = reinforce_pp_returns(token_rewards(scores, mask, kl=kl, kl_coef=cfg.kl_coef), mask, gamma=cfg.gamma)
        assert torch.allclose(pad_rows(batch.advantages, mask), want, atol=1e-5)
        assert abs(history[k].extra["adv/mean"]) < 1e-5
    if name == "reinforce_pp":  # step 1 samples from the reference's own weights (KL 0); step 2 from trained ones
        assert history[0].extra["reward/kl_in_reward"] == 0 < history[1].extra["reward/kl_in_reward"]


def test_rloo_and_dr_grpo_differ_from_grpo_where_they_should():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    grpo = group_advantages(r, 4, std_normalize=True)
    assert torch.allclose(rloo_advantages(r, 4), group_advantages(r, 4, std_normalize=False) * 4 / 3)
    assert not torch.allclose(rloo_advantages(r, 4), grpo)
    assert torch.equal(rloo_advantages(torch.ones(4), 4), torch.zeros(4))  # an all-equal group learns nothing


def test_settings_an_algorithm_does_not_read_are_refused_before_any_work():
    from posttrain.config import ConfigError, PipelineConfig, validate

    base = PipelineConfig()
    for rl, field in [(replace(base.rl, algorithm=Algorithm.GSPO), r"rl\.clip_low / rl\.clip_high"),
                      (replace(base.rl, algorithm=Algorithm.DR_GRPO, std_normalize=False), r"rl\.std_normalize"),
                      (replace(base.rl, algorithm=Algorithm.DR_GRPO, loss_agg=LossAgg.SEQ_MEAN), r"rl\.loss_agg"),
                      (replace(base.rl, algorithm=Algorithm.RLOO, gamma=0.9), r"rl\.gamma"),
                      (replace(base.rl, algorithm=Algorithm.GSPO, clip_low=3e-4, clip_high=4e-4, clip_ratio_c=3.0),
                       r"rl\.clip_ratio_c"),
                      (replace(base.rl, algorithm=Algorithm.RLOO, samples_per_prompt=1), r"rl\.samples_per_prompt")]:
        with pytest.raises(ConfigError, match=field):
            validate(replace(base, rl=rl), ())
    validate(replace(base, rl=replace(base.rl, algorithm=Algorithm.REINFORCE_PP, gamma=0.99, kl_coef=0.01)), ())
