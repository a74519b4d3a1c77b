"""Rollout ahead of the update (rl.max_staleness, posttrain.rl.ahead): the controller over the in-process groups of
tests/rl_fakes.py - whose policy keeps its last versions and gates drift at each row's own, as the real one does -
and the real policy worker's bound and version-matched drift gate on a real model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from posttrain.config import Algorithm, RLConfig
from posttrain.rl.ahead import traj_from_json, traj_to_json
from posttrain.rl.controller import Controller
from posttrain.rl.roles.environment import EpisodeNotes
from posttrain.rl.state import Checkpointer
from posttrain.rl.types import Trajectories
from tests.rl_fakes import NullTracker, fake_sampler, make_fake_groups

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/unit/conftest.py


CFG = RLConfig(steps=6, prompts_per_step=4, samples_per_prompt=4, max_new_tokens=4, lr=0.05, kl_coef=0.0,
               checkpoint_every=2, drift_threshold=1e-5, max_staleness=1)


def controller(cfg=CFG, checkpointer=None) -> Controller:
    return Controller(cfg, make_fake_groups(cfg), fake_sampler(cfg), NullTracker(), checkpointer)



@pytest.mark.parametrize("k", [1, 2])
def test_every_sample_is_k_versions_behind_counted_per_token_and_the_drift_gate_is_at_its_version(k):
    cfg = replace(CFG, max_staleness=k)
    c = controller(cfg)
    seen = []
    step = c.algorithm.step

    def recording(prompts, run):
        out = step(prompts, run)
        seen.append((run.version, [v for v, r in zip(out.traj.versions, out.traj.response_ids) for _ in r]))
        return out

    c.algorithm.step = recording
    hist = c.run(6)
    for version, token_versions in seen:  # every token carries its row's version: exactly max(0, v - k)
        assert set(token_versions) == {max(0, version - k)}, (version, set(token_versions))
    assert [m.extra["async/staleness_max"] for m in hist] == [float(min(s, k)) for s in range(6)]
    assert all(m.extra["async/in_flight"] == k for m in hist)
    assert all(m.drift < 1e-5 for m in hist)  # at the generating version: the weights are exactly those
    assert c.groups["rollout"].version == 6  # every version was pushed, in order, behind the draws


def test_the_policy_refuses_a_row_beyond_the_bound():
    cfg = replace(CFG, max_staleness=1)
    c = controller(cfg)
    c.run(2)
    traj = c.groups["rollout"].generate(c.sampler.next_batch(0), n=2, temperature=1.0, max_new_tokens=2, seed=0)
    from posttrain.rl.types import TrainBatch

    batch = TrainBatch(policy_version=2, prompt_ids=traj.prompt_ids, response_ids=traj.response_ids,
                       old_logprobs=traj.logprobs, ref_logprobs=None, advantages=[1.0] * len(traj.response_ids),
                       versions=[0] * len(traj.response_ids))
    with pytest.raises(RuntimeError, match="beyond the bound"):
        c.groups["policy"].update(batch)


def test_stale_samples_still_learn_the_toy_task():
    cfg = replace(CFG, prompts_per_step=8, samples_per_prompt=8, max_new_tokens=2, lr=0.1, max_staleness=1,
                  drift_threshold=0.05)
    hist = controller(cfg).run(25)
    first, last = sum(m.reward_mean for m in hist[:3]) / 3, sum(m.reward_mean for m in hist[-3:]) / 3
    assert last > first + 0.2, (first, last)


def test_dapo_draws_its_extra_prompts_from_the_stream_within_the_bound():
    cfg = replace(CFG, algorithm=Algorithm.DAPO, max_staleness=1, max_extra_draws=3, clip_high=0.28,
                  drift_threshold=0.05)
    c = controller(cfg)
    hist = c.run(4)
    assert all(m.extra["async/staleness_max"] <= 1 for m in hist)
    draws = sum(int(m.extra["dapo/draws"]) + 1 for m in hist)
    assert c.sampler.cursor == (draws + 1) * cfg.prompts_per_step  # + the one in flight


def _checkpointer(tmp_path):
    return Checkpointer(state_dir=tmp_path / "state", store_root=str(tmp_path / "store"), run_id="t", parents=[],
                        config={}, extra={"reward": "fake"})


def test_a_killed_async_run_resumes_to_the_uninterrupted_run(tmp_path):
    cfg = replace(CFG, max_staleness=2)
    full = controller(cfg)
    uninterrupted = full.run(6)
    first = controller(cfg, checkpointer=_checkpointer(tmp_path))
    first.run(5)  # checkpoints at 2, 4 and 5
    (tmp_path / "state" / "LATEST").write_text("step-000004")  # killed before checkpoint 5 committed
    resumed = controller(cfg, checkpointer=_checkpointer(tmp_path))
    hist = resumed.run(6)
    assert [m.reward_mean for m in hist] == [m.reward_mean for m in uninterrupted]
    assert [m.extra["async/staleness_max"] for m in hist] == [m.extra["async/staleness_max"] for m in uninterrupted]
    assert resumed.groups["policy"].weights().checksum == full.groups["policy"].weights().checksum
    assert resumed.sampler.cursor == full.sampler.cursor


def test_a_checkpoint_is_resumed_only_with_its_own_bound(tmp_path):
    controller(replace(CFG, max_staleness=1), checkpointer=_checkpointer(tmp_path)).run(2)
    with pytest.raises(ValueError, match="written with rl.max_staleness = 1, this run has 2"):
        controller(replace(CFG, max_staleness=2), checkpointer=_checkpointer(tmp_path)).run(4)
    with pytest.raises(ValueError, match="written with rl.max_staleness = 1, this run has 0"):
        controller(replace(CFG, max_staleness=0), checkpointer=_checkpointer(tmp_path)).run(4)


def test_staleness_zero_is_the_synchronous_loop():
    c = controller(replace(CFG, max_staleness=0, drift_threshold=0.05))
    assert c.ahead is None
    hist = c.run(3)
    assert not any(k.startswith("async/") for m in hist for k in m.extra)


def test_in_flight_trajectories_round_trip_exactly_with_their_notes():
    t = Trajectories(policy_version=3, group_index=[0, 0], prompt_ids=[[1, 2], [1, 2]], response_ids=[[3], [4, 5]],
                     logprobs=[[-0.1234567890123], [math.log(0.3), -1e-12]], finished=[True, False],
                     texts=["a", "b"], answers=["1", "1"], tasks=[None, None], messages=[[{"role": "user",
                     "content": "x"}]] * 2, columns=[{}, {"c": 1}], compute_s=0.5, sampled=[[1], [1, 0]],
                     notes=[EpisodeNotes(turns=1, tool_calls=0, failures={}, reward=None),
                            EpisodeNotes(turns=2, tool_calls=1, failures={"raised": 1}, reward=0.5)],
                     sub_phase_s={"environment": 0.1}, versions=[2, 2],
                     transcripts=((0, (("policy", "a"), ("tool", "b"))),))
    import json

    back = traj_from_json(json.loads(json.dumps(traj_to_json(t))), notes_type=EpisodeNotes)
    assert back == t
    with pytest.raises(ValueError, match="no notes_type"):
        traj_from_json(traj_to_json(t))


# --------------------------------------------------------------------------------------------- the real policy

def test_a_real_model_learns_from_samples_one_version_old_with_the_drift_gate_at_their_version(folders, world_of_one):
    """The rollout and policy workers of a real run, in-process: every step trains on samples of the version
    before (after the first), the drift gate compares each with the trainer at its own version - the weights the
    rollout held exactly, so the gap is float noise where the current policy's is the step's lag - and the task
    is learned as the synchronous run learns it (matched engine, seeds 0 / 1: 0.999 / 0.995)."""
    from tests.unit.test_rl_mismatch import CFG as MCFG
    from tests.unit.test_rl_mismatch import _late_reward, _run

    cfg = replace(MCFG, max_staleness=1, drift_threshold=1e-4)
    history = _run(folders, cfg, 0.0)
    assert [m.extra["async/staleness_max"] for m in history] == [0.0] + [1.0] * (cfg.steps - 1)
    assert all(m.drift < 1e-4 for m in history), [m.drift for m in history]
    assert max(m.extra["mismatch/kl"] for m in history[1:]) > 1e-4  # the lag the correction sees is not zero
    assert _late_reward(history) >= 0.9, _late_reward(history)


@pytest.mark.parametrize("fraction", [0.125, 1.0])
def test_a_perturbed_engine_fails_the_version_matched_drift_gate(folders, world_of_one, fraction):
    """Measured on an eighth of the rows (the default) as on all of them."""
    from posttrain.rl.weight_sync import WeightDriftError
    from tests.unit.test_rl_mismatch import CFG as MCFG
    from tests.unit.test_rl_mismatch import SIGMA, _run

    with pytest.raises(WeightDriftError, match="drift at policy version"):
        _run(folders, replace(MCFG, steps=3, max_staleness=1, drift_threshold=0.05, ahead_drift_fraction=fraction),
             SIGMA)


@pytest.mark.parametrize("fraction, measured", [(0.125, [0, 8]), (1.0, list(range(16)))])
def test_the_drift_gate_ahead_measures_an_evenly_spaced_share_of_the_rows(folders, world_of_one, fraction, measured):
    """The real worker's version-matched forward runs over exactly the evenly spaced rows, and counts their tokens
    only."""
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.roles.policy_versions import _evenly_spaced
    from posttrain.rl.types import TrainBatch

    assert _evenly_spaced(list(range(3)), 0.125) == [0] and _evenly_spaced([], 0.125) == []
    policy = PolicyWorker(str(folders["llama"]), replace(CFG, max_staleness=1, ahead_drift_fraction=fraction), 0, 1)
    policy.setup_process_group(*policy.master_address(), 60)
    policy.keep_version()
    rows = TrainBatch(policy_version=0, prompt_ids=[[1, 2, i + 3] for i in range(16)],
                      response_ids=[[3, 4]] * 16, old_logprobs=[[-1.0, -1.0]] * 16, ref_logprobs=None,
                      advantages=[1.0] * 16, versions=[0] * 16)
    seen = []
    log_probs = policy.log_probs
    policy.log_probs = lambda prompts, responses, t: (seen.extend(p[2] - 3 for p in prompts),
                                                       log_probs(prompts, responses, t))[1]
    _, tokens = policy.drift_at_versions([rows], CFG.temperature)
    assert seen == measured and tokens == 2 * len(measured)


def test_the_real_policy_refuses_a_row_beyond_the_bound(folders, world_of_one):
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.types import TrainBatch

    policy = PolicyWorker(str(folders["llama"]), replace(CFG, max_staleness=1), 0, 1)
    policy.setup_process_group(*policy.master_address(), 60)
    policy.version = 3
    row = TrainBatch(policy_version=3, prompt_ids=[[1, 2]], response_ids=[[3, 4]], old_logprobs=[[-1.0, -1.0]],
                     ref_logprobs=None, advantages=[1.0], versions=[1])
    with pytest.raises(RuntimeError, match="2 versions behind this rank's 3; rl.max_staleness is 1: never trained on"):
        policy.update(row, 2, 1, 1)


@pytest.mark.parametrize("overrides, message", [
    ('{"rl": {"max_staleness": -1}}', "rl.max_staleness: must be >= 0"),
    ('{"rl": {"max_staleness": 1}, "placement": {"rollout_workers": 0}}',
     "rl.max_staleness: 1 generates ahead of the update, in rollout workers of their own"),
    ('{"rl": {"ahead_drift_fraction": 0.5}}', "rl.ahead_drift_fraction: only applies to samples generated ahead"),
    ('{"rl": {"max_staleness": 1, "ahead_drift_fraction": 0}}', "rl.ahead_drift_fraction: must be in (0, 1]"),
    ('{"rl": {"max_staleness": 1, "new_weights_between_turns": true}}',
     "rl.new_weights_between_turns: only applies to multi-turn episodes"),
])
def test_the_bound_is_checked_at_plan(overrides, message):
    from posttrain.config import ConfigError
    from posttrain.recipes import resolve

    with pytest.raises(ConfigError) as e:
        resolve("tiny_cpu", overrides)
    assert str(e.value).startswith(message), str(e.value)
    assert resolve("tiny_cpu", '{"rl": {"max_staleness": 2}}').rl.max_staleness == 2


def test_a_stale_rollout_worker_is_named_before_a_sample_of_its_weights_is_trained_on():
    """The load of version 1 queues behind draw 1; its failed check stops every later generation, so the step
    that would train on draw 2 (generated after the load) fails with the worker's name."""
    from posttrain.rl.weight_sync import StaleWeightsError
    from tests.rl_fakes import StaleRolloutGroup

    cfg = replace(CFG, max_staleness=1, drift_threshold=0.05)
    c = Controller(cfg, make_fake_groups(cfg, rollout_cls=StaleRolloutGroup), fake_sampler(cfg), NullTracker(), None)
    c.start()
    c.step()  # draw 0 (version 0); draw 1 launched with version 0, then version 1's load queued
    with pytest.raises(StaleWeightsError, match=r"rollout\[0/1\].*reports version 1"):
        c.step()  # draw 1 is fine; settling version 1's load before publishing version 2 fails
    c.ahead.close()


@pytest.mark.parametrize("name", ["grpo", "rloo", "dr_grpo", "gspo", "reinforce_pp", "dapo", "ppo", "on_policy_distill"])
def test_every_algorithm_trains_on_samples_one_version_behind(folders, world_of_one, name):
    """Each loop of the family, PPO (critic) and on-policy distillation (teacher), with real workers in-process:
    every batch the policy trains on carries versions exactly one behind (after the first step; DAPO's extra draws
    within a step between one behind and none)."""
    from tests.unit import test_rl_distill, test_rl_pg_family, test_rl_ppo

    if name == "ppo":
        cfg = replace(test_rl_ppo.PPO, max_staleness=1, steps=3, checkpoint_every=0)
        c = test_rl_ppo._controller(folders, cfg)
        real, batches = c.groups["policy"].update, []
        c.groups["policy"].update = lambda b, **kw: batches.append(b) or real(b, **kw)
        history = c.run(cfg.steps)
    elif name == "on_policy_distill":
        cfg = replace(test_rl_distill.OPD, max_staleness=1, steps=3)
        history, seen = test_rl_distill._run(folders, cfg, folders["tiny"])
        batches = seen["batches"]
    else:
        base = test_rl_pg_family.CASES[name][0] if name in test_rl_pg_family.CASES else replace(
            test_rl_pg_family.BASE, algorithm=Algorithm(name))
        cfg = replace(base, max_staleness=1, steps=3)
        history, seen, _, _ = test_rl_pg_family._run(folders, cfg)
        batches = seen["batches"]
    assert batches, "no update ran"
    for b in batches:
        assert b.versions is not None and {b.policy_version - v for v in b.versions} <= {0, 1}
        if name != "dapo":  # DAPO's extra draws of a step are taken later, at its own version: between v - 1 and v
            assert b.policy_version == 0 or set(b.versions) == {b.policy_version - 1}
    assert all(m.extra["async/staleness_max"] <= 1 for m in history)
