"""Multi-turn episodes generated ahead of the update that take the next policy version between their turns
(rl.new_weights_between_turns, posttrain.rl.ahead): real rollout and policy workers and the retry game's
environment role in-process - every token carries the version that sampled it, the bound and the drift gate
read it per token, and the run is as reproducible (and resumes as exactly) as one that never switches. Then
the queue order that decides the switch, on Ahead alone."""

from __future__ import annotations

import random
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from posttrain.config import EpisodeConfig, PlacementConfig, RewardConfig, RLConfig
from posttrain.rl.ahead import Ahead
from posttrain.rl.types import PromptBatch, Trajectories

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/unit/conftest.py

GAME = "retry_env:Retry"
CFG = RLConfig(steps=4, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=8, lr=1e-4, kl_coef=0.0,
               checkpoint_every=2, max_staleness=1, new_weights_between_turns=True, environment=GAME,
               ahead_drift_fraction=1.0, drift_threshold=1e-4, remote_timeout_s=120,
               episode=EpisodeConfig(python_path=[str(Path(__file__).parents[1] / "integration")], max_turns=3,
                                     max_total_tokens=40))
"""The retry game over the tiny default's sums: a wrong answer is told "no" and tried again, up to 3 turns."""


def _run(tiny, cfg: RLConfig, steps: int, checkpointer=None, record=None):
    """A controller over real workers in-process (LocalActor): rollout, policy, reward, two environment workers."""
    from posttrain.data.examples import read_examples
    from posttrain.models.io import load_tokenizer
    from posttrain.rl.controller import Controller
    from posttrain.rl.remote import LocalActor
    from posttrain.rl.roles import composed, registry
    from posttrain.rl.roles.environment import EnvironmentGroup, EnvironmentWorker
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.roles.policy_group import PolicyGroup
    from posttrain.rl.roles.reward import RewardGroup, RewardWorker
    from posttrain.rl.roles.rollout import RolloutGroup, RolloutWorker
    from tests.rl_fakes import NullTracker

    md, t = str(tiny["model_dir"]), cfg.remote_timeout_s
    rollout, policy = RolloutWorker(md, 0, 1), PolicyWorker(md, cfg, 0, 1)
    envs = [EnvironmentWorker(cfg.environment, [], cfg.episode, rank, 2) for rank in range(2)]
    pg = PolicyGroup([LocalActor(policy)], [policy.identity()], t, cfg.micro_batch_size, seed=cfg.seed)
    pg.setup()
    groups = {"rollout": RolloutGroup([LocalActor(rollout)], [rollout.identity()], t),
              "environment": EnvironmentGroup([LocalActor(w) for w in envs], [w.identity() for w in envs], t,
                                              source=cfg.environment),
              "reward": RewardGroup([LocalActor(RewardWorker(RewardConfig(), 0, 1))], [("reward", 0)], t),
              "policy": pg}
    settings = registry.RunSettings(rl=cfg, reward=RewardConfig(), placement=PlacementConfig(), model=None,
                                    start_model_dir=md)
    groups.update(registry.stand_ins(settings, groups, max_seq_len=64))
    sampler = composed.prompt_sampler(read_examples(tiny["dataset_dir"], "train"), load_tokenizer(md), cfg,
                                      groups["rollout"], 64)
    if record is not None:
        record(policy)
    c = Controller(cfg, groups, sampler, NullTracker(), checkpointer)
    try:
        history = c.run(steps)
    finally:
        for w in envs:
            w.process.shutdown()
    return c, history, policy


def test_episodes_take_the_next_version_between_turns_and_every_token_carries_the_one_that_sampled_it(
        tiny_sft_model, world_of_one, tmp_path):
    seen = []

    def record(policy):
        drift = policy.drift_at_versions

        def both(shards, temperature):  # the gate as it runs, and as it would with each row's first version only
            out = drift(shards, temperature)
            flat = drift([replace(sh, token_versions=None) for sh in shards], temperature)
            seen.append((shards[0], out, flat))
            return out

        policy.drift_at_versions = both

    _, history, policy = _run(tiny_sft_model, CFG, CFG.steps, record=record)
    assert [m.extra["async/staleness_max"] for m in history] == [0.0, 1.0, 1.0, 1.0]
    switched = [b for b, _, _ in seen if b.token_versions is not None]
    assert len(switched) == 3  # steps 2-4: draws 1-3, each launched at v and published v + 1 before the next
    for b in switched:
        v = b.policy_version
        assert set(b.versions) == {v - 1}  # a row's own version is its first turn's
        for row, mask in zip(b.token_versions, b.sampled):
            assert row[0] == v - 1 and set(row) <= {v - 1, v} and row == sorted(row)  # one switch, forward in time
        both_versions = [row for row in b.token_versions if len(set(row)) == 2]
        assert both_versions, "no episode reached a second turn: the test proves nothing"
    assert all(m.extra["async/switched_rows"] > 0 for m in history[1:]) and history[0].extra["async/switched_rows"] == 0
    # each token at the version that sampled it: the weights the rollout held, exactly (~1e-6: float noise);
    # measured at the row's first version only, the later turns' tokens show the update between them (0.06-0.14)
    for _, (total, tokens), (flat_total, flat_tokens) in seen[1:]:
        assert tokens == flat_tokens > 0, (tokens, flat_tokens)
        assert total / tokens < 1e-5 and flat_total / flat_tokens > 1e-2, (total / tokens, flat_total / flat_tokens)
    assert all(m.drift < CFG.drift_threshold for m in history)
    assert policy.version == 4

    # reproducible and exactly resumable: killed after its step-2 checkpoint, resumed to step 4
    from posttrain.rl.state import Checkpointer

    def checkpointer():
        return Checkpointer(state_dir=tmp_path / "state", store_root=str(tmp_path / "store"), run_id="t",
                            parents=[], config={}, extra={"reward": "verifier"})

    _run(tiny_sft_model, CFG, 2, checkpointer=checkpointer())
    _, resumed, resumed_policy = _run(tiny_sft_model, CFG, 4, checkpointer=checkpointer())
    assert [m.reward_mean for m in resumed] == [m.reward_mean for m in history]
    assert [m.extra["async/switched_rows"] for m in resumed] == [m.extra["async/switched_rows"] for m in history]
    assert resumed_policy.checksum() == policy.checksum()


# --------------------------------------------------------------------------------------------- the queue's order

class _Recorder:
    """A rollout that records, per draw, the version it was launched with and the one `between_turns` gave its
    second turn - the order of calls is what is tested here, not sampling."""

    def __init__(self):
        self.turns: list[tuple[int, int]] = []

    def identities(self):
        return [("rollout", 0)]

    def generate(self, prompts: PromptBatch, *, n, temperature, max_new_tokens, seed, top_p=1.0, top_k=0,
                 between_turns=None):
        second = between_turns()
        self.turns.append((prompts.policy_version, second))
        return Trajectories(policy_version=prompts.policy_version, group_index=[0], prompt_ids=[[1]],
                            response_ids=[[2, 3]], logprobs=[[0.0, 0.0]], finished=[True], texts=["x"], answers=["1"],
                            tasks=[None], messages=[[]], columns=[{}], compute_s=0.0,
                            token_versions=[[prompts.policy_version, second]])


def _batch(version: int) -> PromptBatch:
    return PromptBatch(policy_version=version, example_ids=[0], prompt_ids=[[1]], answers=["1"], tasks=[None],
                       messages=[[]], columns=[{}])


@pytest.mark.parametrize("k, turns", [(1, [(0, 0), (0, 1), (1, 2), (2, 3)]),
                                      (2, [(0, 0), (0, 0), (0, 1), (1, 2), (2, 3)])])
def test_a_draw_switches_only_to_the_load_queued_right_after_it(k, turns):
    """The first k draws (and any draw another draw follows) keep their version; each later one takes the next,
    whose load it runs itself - once: the queue's own turn for that load then finds it done."""
    rollout, loads = _Recorder(), []
    ahead = Ahead(replace(CFG, max_staleness=k), rollout, _batch, random.Random(0))
    ahead.start(0)
    for v in range(len(turns) - k):
        ahead.collect(ahead.take(v))
        ahead.push(v + 1, lambda v=v: loads.append(v + 1))
    ahead.settle()
    ahead.close()
    assert rollout.turns[:len(turns)] == turns
    assert loads == list(range(1, len(turns) - k + 1))  # each load ran once, in order


def test_a_draw_waiting_between_turns_is_released_when_the_run_closes():
    rollout = _Recorder()
    ahead = Ahead(CFG, rollout, _batch, random.Random(0))
    ahead.start(0)  # draw 0 waits at its second turn for the call queued after it: none comes
    closer = threading.Timer(0.5, ahead.close)
    closer.start()
    with pytest.raises(RuntimeError, match="closed while draw 0 waited between two of its turns"):
        ahead.queue[0].result.result(timeout=30)
    closer.join()
