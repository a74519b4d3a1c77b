"""The controller driven by in-process fake groups (tests/rl_fakes.py): types flow, versions increase,
metrics are present, the safety checks fire, checkpoints resume exactly. No Ray, milliseconds per test -
except the reward tests, which run the real reward role with a user function in a spawned child process."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import replace

import pytest

from posttrain.config import RewardConfig, RLConfig, TrackingConfig
from posttrain.rl.controller import Controller, RewardFailureError
from posttrain.rl.metrics import RLTracker, StepMetrics
from posttrain.rl.remote import RemoteWorkerError
from posttrain.rl.state import Checkpointer
from posttrain.rl.weight_sync import StaleWeightsError, WeightDriftError
from tests.rl_fakes import (
    FakeReferenceGroup,
    FakeRewardGroup,
    LowPrecisionRolloutGroup,
    NullTracker,
    StaleRolloutGroup,
    fake_sampler,
    local_reward_group,
    make_fake_groups,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/unit/conftest.py


CFG = RLConfig(steps=4, prompts_per_step=4, samples_per_prompt=4, max_new_tokens=4, lr=0.05, inner_epochs=2,
               kl_coef=0.01, checkpoint_every=2, drift_threshold=0.05)


def controller(cfg=CFG, checkpointer=None, **kw) -> Controller:
    return Controller(cfg, make_fake_groups(cfg, **kw), fake_sampler(cfg), NullTracker(), checkpointer)


def test_full_step_types_versions_and_metrics():
    c = controller()
    c.start()
    m1, m2 = c.step(), c.step()
    assert isinstance(m1, StepMetrics) and (m1.step, m1.policy_version, m2.policy_version) == (1, 1, 2)
    assert c.groups["rollout"].version == 2 and c.groups["policy"].version == 2
    assert set(m1.phase_s) == {"rollout", "reward", "reference", "advantages", "update", "sync"}
    assert set(m1.compute_s) == {"rollout", "reward", "reference", "update"}  # drift: the update's own forward
    assert 0.0 <= m1.accuracy <= 1.0 and m1.reward_failures == 0 and m1.drift < 1e-5
    assert m1.generated_tokens > 0 and m1.response_len_mean > 0 and m1.kl >= 0.0
    assert 0.0 <= m1.orchestration_overhead <= 1.0  # fakes report 0 worker seconds: all controller time
    with pytest.raises(dataclasses.FrozenInstanceError):
        m1.step = 3  # type: ignore[misc]
    flat = m1.flat()
    assert flat["time/rollout_s"] >= 0 and all(isinstance(v, (int, float)) for v in flat.values())


def test_no_reference_group_without_kl():
    cfg = replace(CFG, kl_coef=0.0)
    c = controller(cfg)
    assert "reference" not in c.groups
    c.start()
    assert "reference" not in c.step().phase_s


def test_fakes_learn_the_toy_task():
    cfg = replace(CFG, prompts_per_step=8, samples_per_prompt=8, max_new_tokens=2, kl_coef=0.0, lr=0.1)
    hist = controller(cfg).run(25)
    assert len(hist) == 25
    first, last = sum(m.reward_mean for m in hist[:3]) / 3, sum(m.reward_mean for m in hist[-3:]) / 3
    assert last > first + 0.2, (first, last)


def test_stale_rollout_worker_is_named():
    c = controller(rollout_cls=StaleRolloutGroup)
    c.start()  # version 0: the previous weights are the current ones
    with pytest.raises(StaleWeightsError, match=r"rollout\[0/1\].*reports version 1"):
        c.step()


def test_drift_is_caught_and_names_version():
    c = controller(rollout_cls=LowPrecisionRolloutGroup)
    c.start()  # checksums agree: the rollout holds the right weights
    with pytest.raises(WeightDriftError, match=r"policy version 0.*rollout\[0/1\]"):
        c.step()


class NaNRewardGroup(FakeRewardGroup):
    """A reward group that lets a NaN through for odd prompt tokens."""

    def _score_one(self, prompt, response, answer):
        return float("nan") if prompt[-1] % 2 else super()._score_one(prompt, response, answer)


class HugeRewardGroup(FakeRewardGroup):
    """Finite rewards whose group statistics overflow: +-1e308 alternate, so the mean is inf - inf."""

    def _score_one(self, prompt, response, answer):
        return 1e308 if response[0] % 2 else -1e308


class NaNReferenceGroup(FakeReferenceGroup):
    def log_probs(self, trajectories, *, temperature):
        lp = super().log_probs(trajectories, temperature=temperature)
        return dataclasses.replace(lp, values=[[math.nan, *row[1:]] for row in lp.values])


@pytest.mark.parametrize("poison, what", [("reward", "rewards hold nan"), ("huge", "advantages hold nan"),
                                          ("reference", "reference log-probs hold nan")])
def test_a_non_finite_number_stops_the_step_before_the_update_and_any_checkpoint(poison, what):
    from posttrain.rl.controller import NonFiniteError

    if poison == "reference":
        groups = make_fake_groups(CFG)
        groups["reference"] = NaNReferenceGroup(groups["reference"].model.state_dict())
        c = Controller(CFG, groups, fake_sampler(CFG), NullTracker(), None)
    else:
        c = controller(reward=NaNRewardGroup() if poison == "reward" else HugeRewardGroup())
    c.start()
    policy_version = c.groups["policy"].version
    with pytest.raises(NonFiniteError, match=rf"step 1: {what} .* stopped before the policy update"):
        c.step()
    assert c.groups["policy"].version == policy_version and not c.history  # the poisoned step made no update


def test_reward_failures_are_counted():
    cfg = replace(CFG, max_reward_failure_rate=1.0)  # never stop: count
    c = controller(cfg, reward=FakeRewardGroup(fail_prompt_token=3))
    c.start()
    ms = [c.step() for _ in range(3)]
    assert sum(m.reward_failures for m in ms) > 0
    assert all(m.reward_failures % CFG.samples_per_prompt == 0 for m in ms)  # whole groups of a failing prompt
    assert all(m.num_samples == 16 for m in ms)
    assert all((m.reward_failure_example != "") == (m.reward_failures > 0) for m in ms)


# ----------------------------------------------------------------- the real reward role (sandboxed user function)


def test_user_function_in_the_sandbox_scores_like_the_fake_verifier():
    """The same toy task scored by a user function named by import path (called with prompt, completion and
    answer in a child process) gives exactly the rewards the in-process fake gives."""
    cfg = replace(CFG, kl_coef=0.0)
    fake = controller(cfg).run(3)
    user = controller(cfg, reward=local_reward_group(RewardConfig(fn="tests.reward_fns:first_token"))).run(3)
    assert [m.reward_mean for m in user] == [m.reward_mean for m in fake]
    assert all(m.reward_failures == 0 for m in user) and any(m.reward_mean > 0 for m in user)


def test_failure_rate_above_the_limit_stops_the_run_naming_function_count_step_and_reason():
    cfg = replace(CFG, kl_coef=0.0)  # default rl.max_reward_failure_rate = 0.1; a failing prompt fails 4 of 16
    c = controller(cfg, reward=local_reward_group(RewardConfig(fn="tests.reward_fns:fails_on_prompt_3")))
    with pytest.raises(RewardFailureError, match=r"tests\.reward_fns:fails_on_prompt_3: (4|8|12|16)/16 calls failed "
                       r"at step (\d+) .*ValueError: cannot score prompt '\d+ 3'") as e:
        c.run(20)
    failed_step = int(e.value.args[0].split("at step ")[1].split()[0])
    assert c.step_count == failed_step - 1 and c.version == failed_step - 1  # stopped before that update


def test_failures_below_the_limit_are_on_the_console_line_of_every_step_they_occur(tmp_path, capsys):
    cfg = replace(CFG, kl_coef=0.0, max_reward_failure_rate=0.9)
    tracker = RLTracker(TrackingConfig(wandb=False, log_every=1000), name="t", total=6)
    c = Controller(cfg, make_fake_groups(cfg, reward=local_reward_group(RewardConfig(fn="tests.reward_fns:fails_on_prompt_3"))),
                   fake_sampler(cfg), tracker, None)
    hist = c.run(6)
    lines = capsys.readouterr().out.splitlines()
    with_failures = [m.step for m in hist if m.reward_failures]
    assert with_failures, "the toy data has prompts ending in 3: some step must fail"
    for m in hist:
        printed = [x for x in lines if x.startswith(f"rl step {m.step}/6:")]
        if m.reward_failures:
            assert len(printed) == 1 and f"reward failures {m.reward_failures}/16: ValueError: cannot score" in printed[0]
        elif m.step not in (1, 6):  # a fast run: only the first, failing and last steps are printed
            assert printed == []
        else:
            stats = r"" if m.step == 1 else r", \S+ step/s, ETA \d+s"  # a rate from the second line on
            assert len(printed) == 1 and re.search(rf"\| {m.step}/6 \(\d+%\){stats}$", printed[0]), printed


def test_a_required_argument_no_row_supplies_is_refused_at_start():
    c = controller(reward=local_reward_group(RewardConfig(fn="tests.reward_fns:needs_missing")))
    with pytest.raises(RemoteWorkerError, match=r"needs_missing.*\['not_a_column'\].*available argument names: "
                       r"\['answer', 'completion', 'messages', 'prompt', 'task'\]"):
        c.start()
    assert not c.started


def _checkpointer(tmp_path):
    return Checkpointer(state_dir=tmp_path / "state", store_root=str(tmp_path / "store"), run_id="t", parents=[],
                        config={}, extra={"reward": "fake"})


def test_a_run_redone_from_scratch_logs_each_step_once(tmp_path):
    """Killed before its first checkpoint (the kill tearing the row it was writing), a run starts again at
    step 1 and redoes the steps it had logged: the log must hold each step once, not the old rows as well."""
    ck = _checkpointer(tmp_path)
    for m in controller().run(2):
        ck.record(m)
    with open(ck.log_path, "a") as f:
        f.write('{"step": 3, "loss"')  # torn by the kill
    assert not (tmp_path / "state" / "LATEST").exists()
    controller(checkpointer=ck).run(4)
    assert ck.logged_steps() == [1, 2, 3, 4]
    assert len(ck.log_path.read_text().splitlines()) == 4


def test_checkpoint_resume_gives_the_same_run(tmp_path):
    uninterrupted = controller()
    full = uninterrupted.run(4)

    first = controller(checkpointer=_checkpointer(tmp_path))
    first.run(3)  # checkpoints at 2 and 3 (the last)
    ck = _checkpointer(tmp_path)
    ck.record(first.history[-1])  # simulate a step logged after the last checkpoint, then a kill
    (tmp_path / "state" / "LATEST").write_text("step-000002")  # ... with the kill before checkpoint 3
    resumed = controller(checkpointer=ck)
    hist = resumed.run(4)
    assert [m.step for m in hist] == [1, 2, 3, 4] and resumed.version == 4
    assert ck.logged_steps() == [1, 2, 3, 4]
    # same prompts, same seeds, same optimizer state -> the same rewards as an uninterrupted run
    assert [m.reward_mean for m in hist] == [m.reward_mean for m in full]
    assert resumed.groups["policy"].weights().checksum == uninterrupted.groups["policy"].weights().checksum
    manifest = ck.store.manifest(resumed.model_id)
    assert manifest.kind == "model" and manifest.extra["policy_version"] == 4 and manifest.extra["reward"] == "fake"
    assert manifest.metrics["step"] == 4
    assert [h["step"] for h in manifest.extra["history"]] == [1, 2, 3, 4]  # the report's curves, resume included
    assert json.loads((tmp_path / "state" / "step-000004" / "controller.json").read_text())["sampler"]["cursor"] == 16
