"""A role actor that dies mid-run (SIGKILL of its own process, once) no longer ends the run: the driver sees
the lost worker at once, rebuilds every actor, resumes from the last checkpoint and ends with exactly the
updates - and the final model - of an uninterrupted run: the reference worker (a role without training state)
here, the rollout worker in the middle of a step's multi-turn episodes here (the environment role's open
episodes rebuilt with every actor), the rollout worker and a policy rank in the cluster rehearsal's pod loss, PPO's critic (and with it the
FSDP2 policy's restored state) with the PPO run it must reproduce; the reward worker's death is the `rl.max_restarts = 0` test's. A learned reward model is
rebuilt as the reference worker is (no state of its own); it runs through Ray in the RLHF pipeline's e2e test.
Plus the step watchdog. Run alone: `pytest -m ray tests/integration/test_rl_restart.py`."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from posttrain.config import (
    Algorithm,
    EpisodeConfig,
    Parallelism,
    PlacementConfig,
    RewardConfig,
    RLConfig,
    TrackingConfig,
)
from posttrain.rl.roles.critic import CriticWorker
from posttrain.rl.roles.policy import PolicyWorker
from posttrain.rl.roles.reference import ReferenceWorker
from posttrain.rl.roles.reward import RewardWorker
from posttrain.rl.roles.reward_model import RewardModelWorker
from posttrain.rl.roles.rollout import RolloutWorker

pytestmark = pytest.mark.ray

CFG = RLConfig(steps=4, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=8, kl_coef=0.02, checkpoint_every=2,
               warmup_steps=8, remote_timeout_s=60)
"""A warm-up longer than the run: the resumed steps must take the schedule's rate for their version (a base rate
kept in the optimizer's param groups came back from a DCP checkpoint as the last scaled rate)."""
PLACEMENT = PlacementConfig(policy_workers=2, rollout_workers=1, reward_workers=1, reference_workers=1)
LEAN = PlacementConfig(policy_workers=1, rollout_workers=1, reward_workers=1)
"""For the tests whose run ends at its first step: the fewest actors that still put the reward on its own worker
(every actor start imports torch and transformers: ~8 CPU-s)."""
TRACKING = TrackingConfig(wandb=False)
METHOD = {"rollout": (RolloutWorker, "generate"), "reward": (RewardWorker, "score"),
          "reference": (ReferenceWorker, "log_probs"), "policy": (PolicyWorker, "update"),
          "critic": (CriticWorker, "fit"), "reward_model": (RewardModelWorker, "score")}
"""Role -> (worker class, the method called once per step)."""


def dies_once(role: str, marker: Path, at_call: int) -> type:
    """The role's worker class, except that its `at_call`-th step call SIGKILLs its own process - once per
    test (the marker file): the rebuilt actor works normally."""
    base, method = METHOD[role]

    def call(self, *args, **kwargs):
        self._calls = getattr(self, "_calls", 0) + 1
        if self._calls == at_call and not os.path.exists(self.marker) and getattr(self, "rank", 0) == 0:
            Path(self.marker).write_text(f"{role} killed at call {at_call}")
            os.kill(os.getpid(), signal.SIGKILL)
        return getattr(base, method)(self, *args, **kwargs)

    return type(f"DiesOnce{role.title()}", (base,), {"marker": str(marker), method: call})


PPO_CFG = replace(CFG, algorithm=Algorithm.PPO, critic_warmup_steps=1, parallelism=Parallelism.FSDP2, kl_coef=0.0)
"""PPO: the critic trains alone in step 1, then both; its one-pass `fit` is its once-per-step call. Policy and
critic sharded with FSDP2 (rl.parallelism): their state is restored shard by shard (the policy-kill test above
restores DDP's). No KL term: a reference actor (rebuilt at the restart as well) would only add start-ups - its
own death is the test above."""


def _run(tmp_path: Path, tiny, cfg: RLConfig, workers=None, tag: str = "run", placement=PLACEMENT,
         max_seq_len: int = 32):
    from posttrain.artifacts import ArtifactStore
    from posttrain.rl.run import run_rl

    store = ArtifactStore(tmp_path / "store")
    model = store.put("model", "sft", tiny["model_dir"], run_id="t", parents=[], config={})
    data = store.put("dataset", "addition", tiny["dataset_dir"], run_id="t", parents=[], config={})
    return run_rl(rl_cfg=cfg, reward_cfg=RewardConfig(), placement_cfg=placement, max_seq_len=max_seq_len,
                  tracking_cfg=TRACKING, start_model_dir=tiny["model_dir"], dataset_dir=tiny["dataset_dir"],
                  store_root=str(store.root), run_id="restart-test", parents=[model.id, data.id],
                  state_dir=tmp_path / f"state-{tag}", start_model_id=model.id, workers=workers)


@pytest.fixture(scope="module")
def uninterrupted(ray_local, tiny_sft_model, tmp_path_factory):
    """The same 4 steps without a kill: the final model every restarted run must reproduce."""
    return _run(tmp_path_factory.mktemp("uninterrupted"), tiny_sft_model, CFG)


@pytest.mark.timeout(900)
# reward: the max_restarts=0 test kills it; rollout and policy: the cluster rehearsal removes their pods mid-step
# and asserts the same model id (tests/cluster/test_rayjob_rehearsal.py, warm-up included: it caught the lost
# warm-up rate); the critic's death below restores a trained group's state (FSDP2) here
@pytest.mark.parametrize("role", ["reference"])
def test_a_killed_role_actor_is_replaced_and_the_run_ends_as_if_uninterrupted(
        role, ray_local, tiny_sft_model, tmp_path, uninterrupted, capfd):
    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    marker = tmp_path / "killed"
    res = _run(tmp_path, tiny_sft_model, CFG, workers={role: dies_once(role, marker, at_call=3)})  # in step 3
    assert marker.exists(), "the worker was never killed: the test proves nothing"
    assert res.restarts == 1
    assert [m.step for m in res.history] == [1, 2, 3, 4] and [m.policy_version for m in res.history] == [1, 2, 3, 4]
    assert res.model.id == uninterrupted.model.id  # step 3 re-done from the step-2 checkpoint: same updates
    out = capfd.readouterr().out
    assert "WorkerLostError" in out and f"{role}[" in out and "restart 1/2" in out
    _assert_released(ray_local)


@pytest.mark.timeout(900)
def test_a_killed_critic_is_replaced_and_ppo_ends_as_if_uninterrupted(ray_local, tiny_sft_model, tmp_path,
                                                                      tmp_path_factory, capfd):
    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    whole = _run(tmp_path_factory.mktemp("ppo-uninterrupted"), tiny_sft_model, PPO_CFG)
    assert [m.policy_version for m in whole.history] == [0, 1, 2, 3]  # step 1: the critic's warm-up
    marker = tmp_path / "killed"
    res = _run(tmp_path, tiny_sft_model, PPO_CFG, workers={"critic": dies_once("critic", marker, at_call=3)})
    assert marker.exists(), "the critic was never killed: the test proves nothing"
    assert res.restarts == 1 and [m.step for m in res.history] == [1, 2, 3, 4]
    assert res.model.id == whole.model.id  # critic and policy restored from the step-2 checkpoint: same updates
    out = capfd.readouterr().out
    assert "WorkerLostError" in out and "critic[" in out and "restart 1/2" in out
    _assert_released(ray_local)


EPISODES = replace(CFG, kl_coef=0.0, environment="retry_env:Retry",
                   episode=EpisodeConfig(python_path=[str(Path(__file__).parent)], max_turns=3, max_total_tokens=40))
"""Multi-turn episodes (tests/integration/retry_env.py: a wrong answer is told "no" and tried again): every step
samples up to 3 turns, one rollout call each."""


class DiesMidEpisode(RolloutWorker):
    """A rollout worker that SIGKILLs its own process at the second turn of step 3 (policy version 2) - in the
    middle of that step's episodes, with the environment role holding them open - once per test (the marker)."""

    marker = ""

    def generate(self, prompts, *args, **kwargs):
        self._turns = getattr(self, "_turns", {})
        self._turns[prompts.policy_version] = self._turns.get(prompts.policy_version, 0) + 1
        if prompts.policy_version == 2 and self._turns[2] == 2 and not os.path.exists(self.marker):
            Path(self.marker).write_text("rollout killed at the second turn of step 3")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().generate(prompts, *args, **kwargs)


@pytest.mark.timeout(900)
def test_a_rollout_worker_killed_mid_episode_is_replaced_and_the_run_ends_as_if_uninterrupted(
        ray_local, tiny_sft_model, tmp_path, tmp_path_factory, capfd):
    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    placement = PlacementConfig(policy_workers=1, rollout_workers=1, environment_workers=1)
    whole = _run(tmp_path_factory.mktemp("episodes-uninterrupted"), tiny_sft_model, EPISODES, placement=placement,
                 max_seq_len=64)
    assert max(m.extra["env/turns_mean"] for m in whole.history) > 1  # the episodes do take several turns
    killer = type("DiesMidEpisodeHere", (DiesMidEpisode,), {"marker": str(tmp_path / "killed")})
    res = _run(tmp_path, tiny_sft_model, EPISODES, workers={"rollout": killer}, placement=placement, max_seq_len=64)
    assert (tmp_path / "killed").exists(), "the rollout worker was never killed: the test proves nothing"
    assert res.restarts == 1 and [m.step for m in res.history] == [1, 2, 3, 4]
    assert res.model.id == whole.model.id  # step 3's episodes re-played from the step-2 checkpoint: same updates
    out = capfd.readouterr().out
    assert "WorkerLostError" in out and "rollout[" in out and "restart 1/2" in out
    _assert_released(ray_local)


@pytest.mark.timeout(900)
def test_with_max_restarts_0_a_lost_worker_ends_the_run_naming_it(ray_local, tiny_sft_model, tmp_path):
    from posttrain.rl.remote import WorkerLostError

    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with pytest.raises(WorkerLostError, match=r"stage reward\.score: worker reward\[0/1\]") as e:
        _run(tmp_path, tiny_sft_model, replace(CFG, max_restarts=0, kl_coef=0.0),
             workers={"reward": dies_once("reward", tmp_path / "killed", at_call=1)}, placement=LEAN)
    assert "no restarts left (rl.max_restarts = 0)" in "".join(e.value.__notes__)
    _assert_released(ray_local)


class SlowRewardWorker(RewardWorker):
    """Takes 300 s per call: over a 30 s rl.step_timeout_s, which fires before the 60 s rl.remote_timeout_s."""

    def score(self, *args, **kwargs):
        time.sleep(300)
        return super().score(*args, **kwargs)


@pytest.mark.timeout(900)
def test_the_step_watchdog_names_the_step_and_stage(ray_local, tiny_sft_model, tmp_path):
    from posttrain.rl.run import StepTimeoutError

    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    t0 = time.monotonic()
    # 30 s: room for a slow machine's start-up and rollout before the reward stage it must name
    with pytest.raises(StepTimeoutError, match=r"step 1 did not finish within rl.step_timeout_s = 30s "
                                               r"\(the controller is in stage 'reward'\)"):
        _run(tmp_path, tiny_sft_model, replace(CFG, step_timeout_s=30, max_restarts=0, kl_coef=0.0),
             workers={"reward": SlowRewardWorker}, placement=LEAN)
    assert time.monotonic() - t0 < 200  # the watchdog, not the 300 s call or the 60 s remote timeout after it
    _assert_released(ray_local)


def _assert_released(ray, timeout_s: float = 30.0) -> None:
    deadline = time.time() + timeout_s
    while ray.available_resources().get("CPU", 0) < 4.0 and time.time() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 4.0, ray.available_resources()


ASYNC_CFG = replace(CFG, max_staleness=1, kl_coef=0.0)
"""Rollout one version ahead of the update (rl.max_staleness 1): a checkpoint holds the draw in flight."""


@pytest.mark.timeout(900)
def test_a_policy_rank_killed_mid_update_of_an_async_run_resumes_to_the_uninterrupted_model(
        ray_local, tiny_sft_model, tmp_path, tmp_path_factory, capfd):
    """Killed in step 3's update - while draw 3 generates with version 2's weights -, the run resumes from the
    step-2 checkpoint, whose draw in flight (generated by version 1) step 3 trains on again: the uninterrupted
    async run's model, update for update."""
    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    whole = _run(tmp_path_factory.mktemp("async-uninterrupted"), tiny_sft_model, ASYNC_CFG)
    assert [m.extra["async/staleness_max"] for m in whole.history] == [0.0, 1.0, 1.0, 1.0]
    assert all(m.drift < ASYNC_CFG.drift_threshold for m in whole.history)
    marker = tmp_path / "killed"
    res = _run(tmp_path, tiny_sft_model, ASYNC_CFG, workers={"policy": dies_once("policy", marker, at_call=3)})
    assert marker.exists(), "the policy rank was never killed: the test proves nothing"
    assert res.restarts == 1 and [m.step for m in res.history] == [1, 2, 3, 4]
    assert res.model.id == whole.model.id  # the in-flight draw restored, not regenerated by another version
    assert "WorkerLostError" in capfd.readouterr().out
    _assert_released(ray_local)
