"""The policy-gradient family's loops (rl.algorithm rloo, dr_grpo, gspo, reinforce_pp) on real workers in-process
(a tiny Llama, a gloo group of one): each step hands the policy exactly its estimator's advantages of that
step's rewards and its own objective (GSPO's sequence-level ratio, Dr. GRPO's constant normaliser), the update
applies and moves the weights; REINFORCE++ puts the KL to the reference into the token rewards, not the loss.
The estimators' math against verl is tests/unit/test_pg_family_verl.py; learning curves are bench/algorithms.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from posttrain.config import Algorithm, LossAgg, RLConfig
from posttrain.models.io import load_tokenizer
from posttrain.rl.algorithms.grpo import group_advantages, kl_penalty
from posttrain.rl.algorithms.pg import reinforce_pp_returns, rloo_advantages
from posttrain.rl.algorithms.ppo import token_rewards
from posttrain.rl.loops.common import response_mask
from posttrain.rl.ragged import pad_rows
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


def _run(folders, cfg, reward=None):
    from posttrain.rl.controller import Controller
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.roles.policy_group import PolicyGroup
    from posttrain.rl.roles.reference import ReferenceGroup, ReferenceWorker
    from posttrain.rl.roles.registry import uses_reference
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
    reward = reward or Reward01()
    real_score = reward.score
    reward.score = lambda t: seen["rewards"].append(real_score(t)) or seen["rewards"][-1]
    groups = {"rollout": RolloutGroup([LocalActor(rollout)], [rollout.identity()], 60), "reward": reward,
              "policy": pg}
    if uses_reference(cfg):
        ref = ReferenceWorker(md, 0, 1, cfg)
        rg = ReferenceGroup([LocalActor(ref)], [ref.identity()], 60)
        real_lp = rg.log_probs
        rg.log_probs = lambda t, **kw: seen["ref"].append(real_lp(t, **kw)) or seen["ref"][-1]
        groups["reference"] = rg
    sampler = PromptSampler(_examples(), load_tokenizer(md), prompts_per_step=cfg.prompts_per_step, seed=cfg.seed)
    before = policy.checksum()
    history = Controller(cfg, groups, sampler, NullTracker(), None).run(cfg.steps)
    seen["sampler_cursor"] = sampler.cursor
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
        mask = response_mask(batch)
        kl = kl_penalty(pad_rows(batch.old_logprobs, mask.shape), pad_rows(seen["ref"][k].values, mask.shape), cfg.kl_estimator)
        want = reinforce_pp_returns(token_rewards(scores, mask, kl=kl, kl_coef=cfg.kl_coef), mask, gamma=cfg.gamma)
        assert torch.allclose(pad_rows(batch.advantages, mask.shape), want, atol=1e-5)
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
                      (replace(base.rl, algorithm=Algorithm.RLOO, samples_per_prompt=1), r"rl\.samples_per_prompt"),
                      (replace(base.rl, overlong_buffer=2), r"rl\.overlong_buffer"),
                      (replace(base.rl, algorithm=Algorithm.DAPO, overlong_buffer=99), r"rl\.overlong_buffer")]:
        with pytest.raises(ConfigError, match=field):
            validate(replace(base, rl=rl), ())
    validate(replace(base, rl=replace(base.rl, algorithm=Algorithm.REINFORCE_PP, gamma=0.99, kl_coef=0.01)), ())


class FirstPromptsEqual(Reward01):
    """Reward01, except that the samples of the step's first `equal` prompts all score 1 (their groups teach
    nothing); `equal` counts prompts over the whole run, so draws after it are ordinary."""

    def __init__(self, equal: int):
        self.equal, self.seen_prompts = equal, 0

    def score(self, t):
        out = super().score(t)
        first = sorted(set(t.group_index))
        scores = list(out.scores)
        for i, g in enumerate(t.group_index):
            if self.seen_prompts + first.index(g) < self.equal:
                scores[i] = 1.0
        self.seen_prompts += len(first)
        return replace(out, scores=scores)


DAPO = replace(BASE, algorithm=Algorithm.DAPO, steps=1)


def test_dapo_drops_equal_groups_and_draws_more_prompts_to_fill_the_batch(folders, world_of_one):
    history, seen, before, after = _run(folders, DAPO, reward=FirstPromptsEqual(equal=3))
    (m,) = history
    (batch,) = seen["batches"]
    n, want = DAPO.samples_per_prompt, DAPO.prompts_per_step
    assert len(batch.response_ids) == want * n and after != before
    assert m.extra["dapo/dropped_groups"] >= 3 and m.extra["dapo/draws"] >= 1 and m.extra["dapo/short_batch"] == 0
    assert seen["sampler_cursor"] == want * (1 + int(m.extra["dapo/draws"]))  # each draw took the next prompts
    adv = torch.tensor(batch.advantages).view(-1, n)
    assert (adv.abs().sum(1) > 0).all()  # no group in the batch has all-equal rewards
    assert m.num_samples == want * n * (1 + int(m.extra["dapo/draws"]))  # metrics cover every sample drawn


def test_dapo_at_its_draw_bound_trains_on_a_short_batch_and_says_so(folders, world_of_one, capsys):
    cfg = replace(DAPO, max_extra_draws=0)
    history, seen, _before, _after = _run(folders, cfg, reward=FirstPromptsEqual(equal=2))
    (m,) = history
    (batch,) = seen["batches"]
    kept = int(m.extra["dapo/kept_groups"])
    assert m.extra["dapo/short_batch"] == 1 and kept <= cfg.prompts_per_step - 2
    assert len(batch.response_ids) == kept * cfg.samples_per_prompt and m.policy_version == 1
    assert "training on a short batch" in capsys.readouterr().out


def test_dapo_with_no_group_to_train_on_does_not_update(folders, world_of_one, capsys):
    cfg = replace(DAPO, max_extra_draws=1)
    history, seen, before, after = _run(folders, cfg, reward=FirstPromptsEqual(equal=10**6))
    (m,) = history
    assert seen["batches"] == [] and after == before and m.policy_version == 0
    assert m.extra["dapo/kept_groups"] == 0 and m.extra["dapo/draws"] == 1
    assert "no group to train on" in capsys.readouterr().out


class LengthParity(Reward01):
    """Score 1 for an even number of response tokens: computable from a TrainBatch."""

    def score(self, t):
        out = super().score(t)
        return replace(out, scores=[float(len(r) % 2 == 0) for r in t.response_ids])


def test_dapo_overlong_penalty_shapes_the_advantages(folders, world_of_one):
    from posttrain.rl.algorithms.pg import overlong_penalty

    cfg = replace(DAPO, overlong_buffer=2, overlong_penalty=1.0)
    history, seen, _before, _after = _run(folders, cfg, reward=LengthParity())
    (batch,) = seen["batches"]
    lengths = torch.tensor([len(r) for r in batch.response_ids])
    assert (lengths > cfg.max_new_tokens - cfg.overlong_buffer).any(), "no long response: proves nothing"
    shaped = (lengths % 2 == 0).float() + overlong_penalty(lengths, max_len=cfg.max_new_tokens, buffer=2, factor=1.0)
    want = group_advantages(shaped, cfg.samples_per_prompt, std_normalize=True)
    assert torch.allclose(torch.tensor(batch.advantages), want, atol=1e-6)
    assert history[0].extra["dapo/overlong_mean"] < 0
