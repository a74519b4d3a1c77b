"""The rollout role with multi-turn episodes (rl.environment / rl.tools): what every loop's `generate` phase
calls when the run has an environment role, in place of the rollout group it wraps - so no loop changes.

    EpisodeRollout(rollout_group, environment_group, layout, rl.episode).generate(prompts, n=8, ...) -> Trajectories

Per step: the environment opens n episodes per prompt (`reset(**row)`: the row's columns and its answer);
then, turn by turn, the rollout workers sample the next turn of every episode still going (one batched
`generate` on the exact ids so far), the environment answers the finished turns, and the answers are appended
as the ids of the model's own template (posttrain.envs.episodes.run_episodes: token-exact, the `sampled`
mask). The trajectories carry the episodes' ids, log-probs (0 on the environment's tokens), mask, the
environment's own rewards and what happened (turns, tool calls, failed calls); `texts` is each episode's last
sampled turn - what the verifier or reward function scores.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from posttrain.config import EpisodeConfig, RewardConfig, RLConfig
from posttrain.data.examples import episode_prompt
from posttrain.envs.episodes import EpisodeLayout, run_episodes
from posttrain.envs.plan import checked_layout, episode_limits, episode_row
from posttrain.models.generate import Generation
from posttrain.rl.roles.environment import EnvironmentGroup, EpisodeNotes
from posttrain.rl.roles.protocols import Generates
from posttrain.rl.types import PromptBatch, Trajectories, WeightReport, WeightsHandle, WorkerId


class _TurnSampler:
    """The rollout group as the episodes' Sampler: a turn's contexts (token ids) as a PromptBatch at the
    step's version, the samples back as Generations; the workers' compute time summed over turns.
    `between_turns` (rl.new_weights_between_turns, from rl/ahead.py): called before every turn after the first,
    it returns the version the rollout workers now hold for it (having loaded a newer one, or not)."""

    def __init__(self, rollout: Generates, version: int, between_turns: Callable[[], int] | None = None):
        self.rollout, self.version, self.compute_s = rollout, version, 0.0
        self.between_turns = between_turns
        self.turn_versions: list[int] = []
        """The version that sampled each turn (the engine's j-th call)."""

    def generate(self, prompts, *, n, temperature, max_new_tokens, seed, top_p=1.0, top_k=0) -> list[Generation]:
        if self.turn_versions and self.between_turns is not None:
            self.version = self.between_turns()
        self.turn_versions.append(self.version)
        k = len(prompts)
        batch = PromptBatch(policy_version=self.version, example_ids=[-1] * k, prompt_ids=[list(p) for p in prompts],
                            answers=[None] * k, tasks=[None] * k, messages=[[] for _ in range(k)],
                            columns=[{} for _ in range(k)])
        t = self.rollout.generate(batch, n=n, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                                  top_p=top_p, top_k=top_k)
        if t.policy_version != self.version:
            raise RuntimeError(f"stage rollout.generate: an episode's turn was sampled by policy version "
                               f"{t.policy_version}, expected {self.version}")
        self.compute_s += t.compute_s
        return [Generation(prompt_ids=p, response_ids=r, logprobs=lp, finished=f)
                for p, r, lp, f in zip(t.prompt_ids, t.response_ids, t.logprobs, t.finished)]


EPISODES_SAMPLED = 3
"""Episodes per step kept turn by turn in the trajectories: the first of each of the first prompts."""


class _TimedEnv:
    """The environment group as run_episodes sees it, with the wall time of its answers summed."""

    def __init__(self, env: EnvironmentGroup):
        self.env, self.specs, self.seconds = env, env.specs, 0.0

    def _timed(self, method, *args):
        t = time.perf_counter()
        try:
            return method(*args)
        finally:
            self.seconds += time.perf_counter() - t

    def open(self, keys, rows):
        return self._timed(self.env.open, keys, rows)

    def respond(self, keys, texts):
        return self._timed(self.env.respond, keys, texts)

    def finish(self, keys):
        return self._timed(self.env.finish, keys)


class EpisodeRollout:
    response_room_setting = "rl.episode.max_total_tokens"
    """What sets `response_room` (protocols.ShapesPrompts)."""
    notes_type = EpisodeNotes
    """The type of its rows' notes: what a checkpoint's draws in flight are read back as (rl/ahead.py)."""

    def __init__(self, rollout: Generates, environment: EnvironmentGroup, layout: EpisodeLayout,
                 episode: EpisodeConfig, *, max_seq_len: int):
        """`episode`: rl.episode (each sampled turn's limit is `generate`'s max_new_tokens); `max_seq_len`:
        model.max_seq_len, which an episode's prompt and all its response tokens share."""
        self.rollout, self.environment, self.layout, self.episode = rollout, environment, layout, episode
        self.max_seq_len = max_seq_len

    # ---- as a rollout that shapes its own prompts (protocols.ShapesPrompts): what the prompt sampler reads

    @staticmethod
    def prompt_of(row: dict) -> list[dict]:
        """A row's prompt turns: those before its first assistant turn (a multi-turn demonstration is a whole
        episode)."""
        return episode_prompt(row)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """An episode's opening ids for a row's prompt turns (the tools' system turn included), before any
        first observation: what the prompt sampler measures rows by. With these, `response_room` tokens must fit
        `max_seq_len`; the sampler leaves out rows that would not."""
        return self.layout.prompt_ids(messages, self.environment.specs, None)

    @property
    def response_room(self) -> int:
        """An episode's response holds every turn and the environment's answers: rl.episode.max_total_tokens."""
        return self.episode.max_total_tokens

    def identities(self) -> list[WorkerId]:
        return self.rollout.identities()

    def load_weights(self, weights: WeightsHandle) -> list[WeightReport]:
        return self.rollout.load_weights(weights)

    def generate(self, prompts: PromptBatch, *, n: int, temperature: float, max_new_tokens: int, seed: int,
                 top_p: float = 1.0, top_k: int = 0, between_turns: Callable[[], int] | None = None) -> Trajectories:
        """n episodes per prompt; `max_new_tokens` is each sampled turn's limit (rl.max_new_tokens);
        `between_turns`: see _TurnSampler (the trajectories then say which version sampled each token)."""
        sampler = _TurnSampler(self.rollout, prompts.policy_version, between_turns)
        limits = episode_limits(self.episode, max_new_tokens)
        rows = [episode_row(cols, a) for cols, a in zip(prompts.columns, prompts.answers)]
        env = _TimedEnv(self.environment)
        eps = run_episodes(sampler, self.layout, env, rows, prompts.messages, n=n, limits=limits,
                           temperature=temperature, seed=seed, top_p=top_p, top_k=top_k,
                           key_prefix=f"v{prompts.policy_version}-s{seed}")
        group = [i for i in range(len(prompts.prompt_ids)) for _ in range(n)]
        for e, i in zip(eps, group):
            if len(e.prompt_ids) + len(e.response_ids) > self.max_seq_len:
                raise ValueError(
                    f"episode of train row {prompts.example_ids[i]}: its prompt (with the tools and the first "
                    f"observation: {len(e.prompt_ids)} tokens) and its {len(e.response_ids)} response tokens exceed "
                    f"model.max_seq_len = {self.max_seq_len}; lower rl.episode.max_total_tokens or raise "
                    "model.max_seq_len")
        own = self.environment.rewards
        env_compute, self.environment.compute_s = self.environment.compute_s, 0.0
        return Trajectories(
            policy_version=prompts.policy_version, group_index=group, prompt_ids=[e.prompt_ids for e in eps],
            response_ids=[e.response_ids for e in eps], logprobs=[e.logprobs for e in eps],
            finished=[e.finished for e in eps], texts=[e.final_text for e in eps],
            answers=[prompts.answers[i] for i in group], tasks=[prompts.tasks[i] for i in group],
            messages=[prompts.messages[i] for i in group], columns=[prompts.columns[i] for i in group],
            compute_s=sampler.compute_s + env_compute, sampled=[e.sampled for e in eps],
            notes=[EpisodeNotes(turns=e.turns, tool_calls=e.tool_calls, failures=dict(e.tool_failures),
                                reward=sum(e.step_rewards) + (e.env_reward or 0.0) if own else None) for e in eps],
            sub_phase_s={"environment": env.seconds}, token_versions=_token_versions(eps, sampler.turn_versions),
            transcripts=tuple((i, tuple(eps[i].transcript)) for i in range(0, min(len(eps), EPISODES_SAMPLED * n), n)))


def _token_versions(eps, turn_versions: list[int]) -> list[list[int]] | None:
    """Per response token, the version of the turn it belongs to (the environment's answer: the turn before
    it); None when every turn was sampled by one version."""
    if len(set(turn_versions)) <= 1:
        return None
    out = []
    for e in eps:
        ends = e.turn_starts[1:] + [len(e.response_ids)]
        out.append([turn_versions[j] for j, (a, b) in enumerate(zip(e.turn_starts, ends)) for _ in range(b - a)])
    return out


def compose(rl: RLConfig, reward: RewardConfig, start_model_dir: str, groups: dict[str, Any],
            max_seq_len: int) -> dict[str, Any]:
    """The environment role's stand-in (its registry row's `compose`, applied by composed.run_groups once the
    actors start): the rollout role runs multi-turn episodes through the environment group - EpisodeRollout
    around the rollout group, or around the policy ranks that generate. The layout is checked here, before any
    step: a chat template that cannot keep an episode's tokens is refused, naming it."""
    layout = checked_layout(start_model_dir)
    env = groups["environment"]
    if reward.fn_weight == 0 and not reward.models and not env.rewards:
        raise ValueError(f"reward.fn_weight is 0 and rl.environment {rl.environment!r} gives no reward of its own "
                         "(no step rewards, no get_reward): the episodes would all score 0")
    return {"rollout": EpisodeRollout(groups["rollout"], env, layout, rl.episode, max_seq_len=max_seq_len)}
