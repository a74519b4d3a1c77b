"""PPO's critic role and loop on real workers in-process (a tiny Llama, a gloo group of one): the value of a
response token is the head's output where its log-prob is read, whatever the padding; the critic regresses
its values onto the returns; a non-finite return stops the critic before its optimizer step; its state
round-trips; and the PPO loop trains only the critic during warm-up, then the policy with per-token
advantages, checkpointing and resuming both roles to the same weights as an uninterrupted run."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.config import Algorithm, RLConfig
from posttrain.models.io import load_tokenizer
from posttrain.rl.remote import LocalActor

PPO = RLConfig(algorithm=Algorithm.PPO, steps=3, prompts_per_step=4, samples_per_prompt=2, max_new_tokens=4,
               lr=1e-3, critic_lr=1e-2, critic_warmup_steps=1, checkpoint_every=2, micro_batch_size=4, seed=0)


def _critic(folders, cfg=PPO):
    from posttrain.rl.roles.critic import CriticWorker

    w = CriticWorker(str(folders["llama"]), cfg, 0, 1)
    w.setup_process_group("127.0.0.1", 0, 60)
    return w


def _batch(folders):
    tok = load_tokenizer(folders["llama"])
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ["1+2=", "33+4=", "the answer is 7"]]
    responses = [[5, 6, 7], [8], [9, 10]]
    return prompts, responses


def test_the_value_of_a_token_is_read_where_its_log_prob_is_whatever_the_padding(folders, world_of_one):
    from posttrain.rl.roles.critic import response_values

    w = _critic(folders)
    prompts, responses = _batch(folders)
    batched, _ = w.values(prompts, responses)
    for p, r, got in zip(prompts, responses, batched):
        ids = torch.tensor([p + r[:-1]])
        alone = w.model(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None],
                        attention_mask=torch.ones_like(ids))[0, len(p) - 1:]  # positions predicting r[0..]
        assert len(got) == len(r)
        assert max(abs(a - float(b)) for a, b in zip(got, alone.detach())) < 1e-5
    v, mask = response_values(w.model, prompts, responses, w.tok.pad_token_id)
    assert mask.sum(1).tolist() == [3, 1, 2] and v.shape == (3, 3)


def test_the_critic_regresses_its_values_onto_the_returns(folders, world_of_one):
    from posttrain.rl.roles.critic import CriticBatch

    w = _critic(folders)
    prompts, responses = _batch(folders)
    target = [[1.0] * len(r) if i % 2 == 0 else [0.0] * len(r) for i, r in enumerate(responses)]
    losses = []
    for _ in range(15):
        old, _ = w.values(prompts, responses)
        res = w.update([CriticBatch(policy_version=0, prompt_ids=prompts, response_ids=responses, old_values=old,
                                    returns=target)], [6], [2])
        assert res.applied
        losses.append(res.loss / res.tokens)
    assert w.version == 15
    assert losses[-1] < 0.1 * losses[0], losses


def test_a_non_finite_return_stops_the_critic_before_its_optimizer_step(folders, world_of_one):
    from posttrain.rl.roles.critic import CriticBatch

    w = _critic(folders)
    prompts, responses = _batch(folders)
    old, _ = w.values(prompts, responses)
    before = w.checksum()
    bad = [[math.nan] * len(r) for r in responses]
    res = w.update([CriticBatch(policy_version=0, prompt_ids=prompts, response_ids=responses, old_values=old,
                                returns=bad)], [6], [1])
    assert not res.applied and "value loss is nan" in res.stopped
    assert w.checksum() == before and w.version == 0


def test_the_critic_state_round_trips(folders, world_of_one, tmp_path):
    from posttrain.rl.roles.critic import CriticBatch

    w = _critic(folders)
    prompts, responses = _batch(folders)
    old, _ = w.values(prompts, responses)
    w.update([CriticBatch(policy_version=0, prompt_ids=prompts, response_ids=responses, old_values=old,
                          returns=[[1.0] * len(r) for r in responses])], [6], [1])
    w.save_state(str(tmp_path))
    fresh = _critic(folders)
    assert fresh.checksum() != w.checksum()
    assert fresh.load_state(str(tmp_path)) == 1 and fresh.checksum() == w.checksum()
    assert (tmp_path / "train" / ".metadata").exists()  # the shared core's state (spmd.state, DCP)


def _groups(folders, cfg):
    from posttrain.config import RewardConfig
    from posttrain.rl.roles.critic import CriticWorker
    from posttrain.rl.roles.critic_group import CriticGroup
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.roles.policy_group import PolicyGroup
    from posttrain.rl.roles.reward import RewardGroup, RewardWorker
    from posttrain.rl.roles.rollout import RolloutGroup, RolloutWorker

    md = str(folders["llama"])
    rollout, reward = RolloutWorker(md, 0, 1), RewardWorker(RewardConfig(), 0, 1)
    policy, critic = PolicyWorker(md, cfg, 0, 1), CriticWorker(md, cfg, 0, 1)
    pg = PolicyGroup([LocalActor(policy)], [policy.identity()], 60, cfg.micro_batch_size,
                     mini_batches=cfg.mini_batches, seed=cfg.seed)
    cg = CriticGroup([LocalActor(critic)], [critic.identity()], 60, cfg.micro_batch_size,
                     mini_batches=cfg.mini_batches, seed=cfg.seed)
    pg.setup()
    cg.setup()
    return {"rollout": RolloutGroup([LocalActor(rollout)], [rollout.identity()], 60),
            "reward": RewardGroup([LocalActor(reward)], [reward.identity()], 60), "policy": pg, "critic": cg}


def _examples():
    return [{"messages": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b),
             "task": "addition"} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (9, 1), (4, 4), (6, 1)]]


def _controller(folders, cfg, checkpointer=None):
    from posttrain.rl.controller import Controller
    from posttrain.rl.state import PromptSampler
    from tests.rl_fakes import NullTracker

    sampler = PromptSampler(_examples(), load_tokenizer(folders["llama"]), prompts_per_step=cfg.prompts_per_step,
                            seed=cfg.seed)
    return Controller(cfg, _groups(folders, cfg), sampler, NullTracker(), checkpointer)


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_ppo_warms_the_critic_up_then_trains_the_policy_on_per_token_advantages(folders, world_of_one, mini_batches):
    from dataclasses import replace

    cfg = replace(PPO, mini_batches=mini_batches)  # 1: critic.fit (one pass); 2: critic.values, then update
    c = _controller(folders, cfg)
    history = c.run(3)
    assert [m.policy_version for m in history] == [0, 1, 2]  # step 1 trained only the critic
    critic = c.groups["critic"].workers[0]._obj
    assert critic.version == 3
    for m in history:
        assert {"critic/value_loss", "critic/vf_explained_var", "critic/values_mean", "critic/returns_mean",
                "adv/mean", "adv/std"} <= set(m.extra)
        assert abs(m.extra["adv/mean"]) < 1e-5 and abs(m.extra["adv/std"] - 1) < 1e-3  # whitened over the batch
        assert "critic" in m.compute_s and "critic" in m.phase_s and ("values" in m.phase_s) == (mini_batches > 1)
    assert "update" not in history[0].phase_s and "update" in history[1].phase_s


@pytest.mark.parametrize("stop_after", [2])
def test_ppo_resumes_policy_and_critic_to_the_uninterrupted_weights(folders, world_of_one, tmp_path, stop_after):
    from posttrain.rl.state import Checkpointer

    def checkpointer(name):
        return Checkpointer(state_dir=tmp_path / name, store_root=str(tmp_path / "store"), run_id=name,
                            parents=[], config={}, extra={})

    whole = _controller(folders, PPO, checkpointer("whole"))
    whole.run(3)
    first = _controller(folders, PPO, checkpointer("cut"))
    first.run(stop_after)  # checkpoint at step 2 (checkpoint_every=2), then the "kill"
    resumed = _controller(folders, PPO, checkpointer("cut"))
    resumed.run(3)
    assert resumed.history[-1].step == 3
    for role in ("policy", "critic"):
        assert resumed.groups[role].workers[0]._obj.checksum() == whole.groups[role].workers[0]._obj.checksum()


def test_one_pass_fit_gives_the_values_and_update_of_the_two_calls(folders, world_of_one):
    from posttrain.rl.algorithms import ppo
    from posttrain.rl.roles.critic import CriticBatch, CriticFit

    prompts, responses = _batch(folders)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    rewards = ppo.token_rewards(torch.tensor([1.0, 0.0, 1.0]), mask)
    rows = [rewards[i, :len(r)].tolist() for i, r in enumerate(responses)]
    two, one = _critic(folders), _critic(folders)
    assert one.one_pass()
    old, _ = two.values(prompts, responses)
    v = torch.zeros(3, 3)
    for i, row in enumerate(old):
        v[i, :len(row)] = torch.tensor(row)
    returns = ppo.gae_returns(rewards, v, mask, gamma=0.9, lam=0.8)
    a = two.update([CriticBatch(policy_version=0, prompt_ids=prompts, response_ids=responses, old_values=old,
                                returns=[returns[i, :len(r)].tolist() for i, r in enumerate(responses)])], [6], [2])
    b = one.fit(CriticFit(policy_version=0, prompt_ids=prompts, response_ids=responses, token_rewards=rows,
                          gamma=0.9, lam=0.8), 6, 2)
    assert max(abs(x - y) for p, q in zip(old, b.values) for x, y in zip(p, q)) < 1e-5
    assert abs(a.loss - b.loss) < 1e-6 and abs(a.grad_norm - b.grad_norm) < 1e-5
    wa, wb = two.model.state_dict(), one.model.state_dict()
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-6
    assert a.version == b.version == 1


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_non_finite_values_stop_the_step_before_any_optimizer_step(folders, world_of_one, mini_batches):
    from dataclasses import replace

    from posttrain.rl.controller import NonFiniteError

    cfg = replace(PPO, critic_warmup_steps=0, mini_batches=mini_batches)
    c = _controller(folders, cfg)
    c.start()
    critic, policy = c.groups["critic"].workers[0]._obj, c.groups["policy"].workers[0]._obj
    with torch.no_grad():
        critic.model.rm.score.weight.fill_(math.nan)
    before = policy.checksum()
    with pytest.raises(NonFiniteError, match=r"step 1: critic values hold nan"):
        c.step()
    assert critic.version == 0 and policy.version == 0 and policy.checksum() == before and not c.history


def test_the_critic_fits_and_gae_steps_over_an_episodes_environment_tokens(folders, world_of_one):
    """With `sampled` (a multi-turn episode), the environment's tokens are in the critic's forward but not in
    its loss, its token count or GAE's recursion: rewards placed there change nothing; without the mask they do."""
    from posttrain.rl.roles.critic import CriticFit

    prompts, _ = _batch(folders)
    responses = [[5, 6, 7, 8, 9], [8, 4], [9, 10, 11]]
    sampled = [[1, 0, 0, 1, 1], [1, 1], [1, 0, 1]]
    rewards = [[0.0, 0.0, 0.0, 0.0, 1.0], [0.0, 0.5], [0.0, 0.0, -1.0]]
    noisy = [[r + (7.0 if not s else 0.0) for r, s in zip(rr, ss)] for rr, ss in zip(rewards, sampled)]

    def fit(token_rewards, mask):
        w = _critic(folders)
        fit = CriticFit(policy_version=0, prompt_ids=prompts, response_ids=responses, token_rewards=token_rewards,
                        gamma=1.0, lam=0.95, sampled=mask)
        tokens = sum(map(sum, mask)) if mask else sum(map(len, responses))
        res = w.fit(fit, tokens, 1)
        return res, {k: v.detach().clone() for k, v in w.model.state_dict().items()}

    (a, wa), (b, wb), (c, wc) = fit(rewards, sampled), fit(noisy, sampled), fit(noisy, None)
    assert a.tokens == b.tokens == 7 and c.tokens == 10
    assert a.values == b.values and abs(a.loss - b.loss) < 1e-7
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) == 0.0
    assert max(float((wa[k] - wc[k]).abs().max()) for k in wa) > 1e-6
