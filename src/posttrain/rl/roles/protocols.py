"""What a role group does, as the loops see it: one Protocol per capability, named for the capability and not
for a class. The loops (rl/loops/) type their role fields and helpers with these, so a loop depends on what a
role does - generates, scores, gives log-probs, trains - not on where it runs: the groups in rl/roles/ drive Ray
actors, the tests' in-process fakes satisfy the same Protocols, and go-to-definition from a loop's call lands
here, one hop from the group that implements it (named in each docstring)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from posttrain.rl.roles.critic import CriticBatch, CriticFit, CriticStats, Values
    from posttrain.rl.types import (
        LogProbs,
        PromptBatch,
        Rewards,
        Scores,
        TrainBatch,
        Trajectories,
        UpdateStats,
        WeightReport,
        WeightsHandle,
        WorkerId,
    )


class Generates(Protocol):
    """Samples responses and takes new weights: rollout.RolloutGroup (rollout workers, transformers or vLLM), or
    rollout.PolicyRollout (the policy ranks generate themselves)."""

    def generate(self, prompts: PromptBatch, *, n: int, temperature: float, max_new_tokens: int, seed: int,
                 top_p: float = 1.0, top_k: int = 0) -> Trajectories: ...

    def load_weights(self, weights: WeightsHandle) -> list[WeightReport]: ...

    def identities(self) -> list[WorkerId]: ...


@runtime_checkable
class ShapesPrompts(Protocol):
    """A rollout role that opens its samples with its own prompt ids instead of the chat template's plain
    rendering, and needs its own room for the response: episode_rollout.EpisodeRollout (an episode opens with the
    tools' system turn and its response holds every turn). The prompt sampler (composed.prompt_sampler) measures
    and keeps rows by these; a rollout without them gets the plain prompts and rl.max_new_tokens of room."""

    def prompt_of(self, row: dict) -> list[dict]: ...

    def prompt_ids(self, messages: list[dict]) -> list[int]: ...

    @property
    def response_room(self) -> int: ...

    response_room_setting: str
    """The setting `response_room` comes from, for errors."""


class ScoresWithFunctions(Protocol):
    """Scores samples with the user's reward functions (or the built-in verifier): reward.RewardGroup."""

    weight: float
    """reward.fn_weight: the functions' share of the reward beside the scoring roles."""

    def score(self, trajectories: Trajectories) -> Rewards: ...

    def check_arguments(self, columns: list[str]) -> None: ...


class Scorer(Protocol):
    """A scoring role (a registry row with `scores=True`): reward_model.RewardModelGroup."""

    role: str

    def score(self, trajectories: Trajectories) -> Scores: ...

    def weighted(self, scores: Scores) -> list[float]: ...


class GivesLogProbs(Protocol):
    """A frozen model's per-token log-probs of the samples: reference.ReferenceGroup, PolicyBaseReference (the
    policy with its LoRA adapters off), teacher.TeacherGroup."""

    def log_probs(self, trajectories: Trajectories, *, temperature: float) -> LogProbs: ...


class TrainsPolicy(Protocol):
    """The SPMD policy: one update per step, its weights for the rollout side: policy_group.PolicyGroup."""

    def update(self, batch: TrainBatch, *, drift_threshold: float = ...) -> UpdateStats: ...

    def weights(self) -> WeightsHandle: ...


class TrainsCritic(Protocol):
    """PPO's SPMD critic: critic_group.CriticGroup."""

    def values(self, trajectories: Trajectories) -> Values: ...

    def one_pass(self) -> bool: ...

    def fit(self, batch: CriticFit) -> tuple[Values, CriticStats]: ...

    def update(self, batch: CriticBatch) -> CriticStats: ...
