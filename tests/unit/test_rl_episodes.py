"""The RL run's multi-turn rollouts, in-process: the rollout role (a real RolloutWorker with the shared tiny SFT
model) and the environment role (two real EnvironmentWorkers, each with its sandboxed tool process running a
retry game, tests/integration/retry_env.py) composed by the registry as every loop's rollout (the environment row's `compose`,
registry.stand_ins -> EpisodeRollout). The trajectories hold whole episodes token-exactly with their `sampled` mask, the environment's
own rewards and what happened; the environment role scores them. Through Ray: tests/integration/test_rl_ray.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.config import EpisodeConfig, PlacementConfig, RewardConfig, RLConfig
from posttrain.data.chat import encode_prompt
from posttrain.rl.metrics import notes_metrics
from posttrain.rl.remote import LocalActor
from posttrain.rl.roles import registry
from posttrain.rl.roles.environment import EnvironmentGroup, EnvironmentWorker
from posttrain.rl.roles.rollout import RolloutGroup, RolloutWorker
from posttrain.rl.types import PromptBatch

GAME = "retry_env:Retry"
EPISODE = EpisodeConfig(python_path=[str(Path(__file__).parents[1] / "integration")], max_turns=3, max_env_tokens=8,
                        max_total_tokens=200, tool_timeout_s=30)
"""The tiny tokenizer spends ~1 token per character of English: the game's "no" takes ~10 tokens with its turn."""


@pytest.fixture(scope="module")
def roles(tiny_sft_model):
    model_dir = str(tiny_sft_model["model_dir"])
    rollout_worker = RolloutWorker(model_dir, 0, 1)
    rollout = RolloutGroup([LocalActor(rollout_worker)], [rollout_worker.identity()], 60.0)
    env_workers = [EnvironmentWorker(GAME, [], EPISODE, rank, 2) for rank in range(2)]
    env = EnvironmentGroup([LocalActor(w) for w in env_workers], [w.identity() for w in env_workers], 60.0,
                           source=GAME)
    settings = registry.RunSettings(rl=RLConfig(environment=GAME, max_new_tokens=12, episode=EPISODE),
                                    reward=RewardConfig(), placement=PlacementConfig(), model=None,
                                    start_model_dir=model_dir)
    groups = registry.stand_ins(settings, {"rollout": rollout, "environment": env}, max_seq_len=400)
    yield groups["rollout"], env, env_workers
    for w in env_workers:
        w.process.shutdown()


def _prompts(answers: list[str]) -> PromptBatch:
    """The model's own task (it answers 46 and stops: an in-distribution first turn on any CPU); the game wants
    `answers` - where that is not 46 (the tests give words, which it never writes) it is told "no" and plays on."""
    k = len(answers)
    return PromptBatch(policy_version=0, example_ids=list(range(k)), prompt_ids=[[1]] * k, answers=answers,
                       tasks=[None] * k, messages=[[{"role": "user", "content": "12+34="}] for _ in range(k)],
                       columns=[{} for _ in range(k)])


def test_the_rollout_role_runs_whole_episodes_through_the_environment_role(roles):
    rollout, env, _workers = roles
    traj = rollout.generate(_prompts(["46", "none", "never"]), n=2, temperature=1.0, max_new_tokens=12, seed=5)
    assert traj.group_index == [0, 0, 1, 1, 2, 2] and traj.policy_version == 0 and traj.answers[4] == "never"
    assert all(0 in m for m in traj.sampled[2:])  # the game answered the wrong rows' turns
    for ids, lps, mask, ep in zip(traj.response_ids, traj.logprobs, traj.sampled, traj.notes):
        assert len(ids) == len(lps) == len(mask) <= EPISODE.max_total_tokens
        assert all(lp == 0.0 for lp, m in zip(lps, mask) if m == 0) and all(lp <= 0 for lp, m in zip(lps, mask) if m)
        runs = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))  # sampled turns in the ids
        assert 1 <= ep.turns <= 3 and runs == ep.turns and ep.tool_calls == 0 and ep.failures == {}
    assert all(ep.turns >= 2 for ep in traj.notes[2:])
    # the game's own reward (get_reward: 1 / attempts when solved, 0 unsolved), read as each episode ended
    env_rewards = [ep.reward for ep in traj.notes]
    assert env_rewards[2:] == [0.0] * 4 and all(r in (0.0, 1.0, 0.5, 1 / 3) for r in env_rewards)
    assert all(r == 0.0 for r, f in zip(env_rewards, traj.finished) if not f)
    tok = rollout.layout.tokenizer  # the game's answers are plain user turns (a tool's result would be wrapped)
    env_text = [tok.decode([t for t, m in zip(ids, mask) if not m]) for ids, mask in zip(traj.response_ids, traj.sampled)]
    assert all("no" in t for t in env_text[2:]) and not any("tool_response" in t for t in env_text)
    assert env._owner == {}  # every episode finished and closed on the worker that held it
    # the environment's answering time and the first episodes turn by turn travel with the trajectories
    assert traj.sub_phase_s["environment"] > 0 and [i for i, _ in traj.transcripts] == [0, 2, 4]  # each prompt's first
    assert [who for who, _ in traj.transcripts[2][1]][:3] == ["policy", "env", "policy"]
    m = notes_metrics(traj)
    assert m["env/turns_mean"] == sum(e.turns for e in traj.notes) / 6 and m["env/tool_calls_mean"] == 0
    assert traj.compute_s > 0


def test_the_environment_role_scores_its_episodes_and_names_its_code(roles):
    rollout, env, _ = roles
    traj = rollout.generate(_prompts(["46", "none"]), n=2, temperature=1.0, max_new_tokens=12, seed=1)
    scores = env.score(traj)
    assert scores.names == ["env"] and scores.sources == [GAME] and env.weighted(scores) == [ep.reward for ep in traj.notes]
    assert set(env.identity) == {GAME} and len(env.identity[GAME]) == 64  # the game's source sha256, for lineage
    q = [{"role": "user", "content": "12+34="}]  # the game has no tools: an episode opens on the plain prompt
    assert rollout.prompt_ids(q) == encode_prompt(rollout.layout.tokenizer, q)
