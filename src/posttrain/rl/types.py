"""Typed handoffs between the RL stages.

    PromptBatch --rollout--> Trajectories --reward--> Rewards
         Trajectories --reference--> LogProbs             (only when kl_coef > 0)
         Rewards --the algorithm's advantages--> advantages (one per sample or per token)
         Trajectories + advantages (+ LogProbs) -->    TrainBatch --policy--> UpdateStats
         policy --WeightsHandle--> rollout workers --WeightReport--> controller (version + checksum check)

Every record is frozen and carries the policy version that produced it, so a stale batch or a stale
worker is detectable where it is consumed. Lists are row-aligned: index i of every per-sample list refers
to the same trajectory. The controller and the loops take role groups by duck typing (the groups in
rl/roles/), so a test can drive them with in-process fakes as well as with real Ray actor groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, Self

from posttrain.config import LossAgg


@dataclass(frozen=True, kw_only=True)
class WorkerId:
    """Who did the work: reported by every worker so errors and metrics can name it."""

    role: str
    """"rollout", "reward", "reference" or "policy"."""
    rank: int
    world_size: int
    node: str
    """Ray node id (or host name in-process)."""
    pid: int

    def __str__(self) -> str:
        return f"{self.role}[{self.rank}/{self.world_size}] (pid {self.pid})"


@dataclass(frozen=True, kw_only=True)
class PromptBatch:
    policy_version: int
    """Weights version the rollout workers must hold when they generate from this batch."""
    example_ids: list[int]
    """(P,) row index of each prompt in the dataset's train split."""
    prompt_ids: list[list[int]]
    """(P, prompt_len_i) token ids, chat template already applied (add_generation_prompt=True)."""
    answers: list[str | None]
    """(P,) reference answers for the verifier."""
    tasks: list[str | None]
    """(P,) verifier name per prompt ("addition", "chain", "exact", ...)."""
    messages: list[list[dict]]
    """(P,) the prompt turns [{role, content}] of each example, for reward functions that read the prompt."""
    columns: list[dict]
    """(P,) every other column of each example's source row ({} for built-in tasks): reward arguments."""


@dataclass(frozen=True, kw_only=True)
class Trajectories:
    policy_version: int
    """Version of the weights that sampled these tokens."""
    group_index: list[int]
    """(B,) index into the PromptBatch: samples of one prompt form one GRPO group, stored consecutively."""
    prompt_ids: list[list[int]]
    """(B, prompt_len_i)."""
    response_ids: list[list[int]]
    """(B, response_len_i), including the EOS token when the sample finished."""
    logprobs: list[list[float]]
    """(B, response_len_i) log-probs under the sampling distribution (raw logits / temperature)."""
    finished: list[bool]
    """(B,) True when the sample stopped at EOS (False: hit max_new_tokens)."""
    texts: list[str]
    """(B,) decoded responses (special tokens skipped)."""
    answers: list[str | None]
    tasks: list[str | None]
    messages: list[list[dict]]
    """(B,) the prompt turns of each sample's example (the same list object for the samples of one prompt)."""
    columns: list[dict]
    """(B,) the example's other columns, as in PromptBatch.columns."""
    compute_s: float
    """Seconds spent generating, as timed inside the workers (max over workers)."""
    sampled: list[list[int]] | None = None
    """(B, response_len_i) 1 where the policy sampled the token, 0 where the rollout put it there itself (a
    multi-turn episode's tool results and observations); such tokens' log-probs are 0 and they are context only:
    every loss, statistic and token count is over the sampled ones (rl/ragged.py). None: every response token
    was sampled."""
    notes: list[RowNotes] | None = None
    """(B,) what a rollout role that does more than sample says about each row (multi-turn episodes: turns, tool
    calls, failed calls, the environment's own reward - rl/roles/environment.py::EpisodeNotes). The metrics
    aggregate them by their type's `step_metrics`; a role that knows the type reads its fields (the environment
    role scores with its rewards). None: nothing beyond the samples."""
    sub_phase_s: dict[str, float] = field(default_factory=dict)
    """Wall seconds within the rollout that other roles spent on it, by role (the environment answering the
    episodes' turns): the metrics count each as that role's phase, not the rollout's."""
    versions: list[int] | None = None
    """(B,) the policy version that generated each row, with rl.max_staleness > 0 (rl/ahead.py; rows of several
    draws, DAPO's, may differ): its first token's, the oldest. Every token of a row carries it unless
    `token_versions` says otherwise. None: every row is `policy_version`'s."""
    token_versions: list[list[int]] | None = None
    """(B, response_len_i) the version that sampled each response token, when an episode took a new version
    between its turns (rl.new_weights_between_turns): a turn's tokens and the environment's answer after it carry
    the version of that turn. None: every token carries its row's `versions` entry."""
    transcripts: tuple[tuple[int, tuple[tuple[str, str], ...]], ...] = ()
    """A few rows turn by turn for the RL page, as (row, turns), each turn (who, text): "policy" for sampled
    text, the rollout's own names for the rest (a multi-turn episode's "tool" or "env"). A tuple: a sample, not a
    per-row field (take_rows keeps it whole). Empty: nothing to show beyond the responses."""


class RowNotes(Protocol):
    """A row's notes (Trajectories.notes), as the metrics see them: the notes' type turns a step's rows into
    its metrics under its own names."""

    @classmethod
    def step_metrics(cls, notes: Sequence[Self], finished: Sequence[bool]) -> dict[str, float]: ...


@dataclass(frozen=True, kw_only=True)
class Rewards:
    policy_version: int
    scores: list[float]
    """(B,) scalar reward per trajectory."""
    failures: list[str | None]
    """(B,) None, or why scoring failed (raised, timed out, died, returned a non-number); such a score is 0."""
    scorer: str
    """What scored: the user's `module:function`, or "posttrain.data.verifiers:score"."""
    compute_s: float


@dataclass(frozen=True, kw_only=True)
class Scores:
    """A scoring role's answer (a registry row with `scores=True`, e.g. the learned reward models): named
    columns of per-sample scores, which its group weighs (its `weighted(scores)`) into the step's reward."""

    policy_version: int
    """Version of the trajectories they score."""
    names: list[str]
    """(M,) column names: the metric `reward/<name>_mean` and the name in a non-finite error ("model0")."""
    sources: list[str]
    """(M,) what produced each column, as the settings name it (a reward model's folder or artifact id)."""
    scores: list[list[float]]
    """(M, B) column m's score of sample b."""
    compute_s: float


@dataclass(frozen=True, kw_only=True)
class LogProbs:
    policy_version: int
    """Version of the trajectories they were computed for."""
    values: list[list[float]]
    """(B, response_len_i) teacher-forced log-probs of the trajectories' tokens (temperature-scaled like the
    rollout) under the frozen reference model."""
    compute_s: float


class PolicyLoss(str, Enum):
    """Which policy objective an algorithm's TrainBatch asks the policy workers for."""

    CLIP = "clip"
    """PPO's clipped token-level ratio (grpo.policy_loss; dual-clip with rl.clip_ratio_c)."""
    GSPO = "gspo"
    """GSPO's clipped sequence-level ratio (pg.gspo_loss)."""


@dataclass(frozen=True, kw_only=True)
class TrainBatch:
    policy_version: int
    """The update must start from exactly this version (checked by the policy workers)."""
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    old_logprobs: list[list[float]]
    """(B, response_len_i) behaviour log-probs (from the rollout) for the importance ratio."""
    ref_logprobs: list[list[float]] | None
    """(B, response_len_i) reference log-probs, or None when kl_coef == 0."""
    advantages: list[float] | list[list[float]]
    """(B,) one per sequence, or (B, response_len_i) one per token (PPO, REINFORCE++)."""
    loss: PolicyLoss = PolicyLoss.CLIP
    """The algorithm's policy objective."""
    loss_agg: LossAgg | None = None
    """The algorithm's own aggregation (Dr. GRPO's constant normaliser, GSPO's sequence mean); None: rl.loss_agg."""
    sampled: list[list[int]] | None = None
    """(B, response_len_i) Trajectories.sampled: the tokens the loss, its statistics and the token counts are
    over (the rest are context only). None: every response token."""
    versions: list[int] | None = None
    """(B,) Trajectories.versions: the version that generated each row (rl.max_staleness > 0). The policy
    workers refuse a row more than rl.max_staleness versions behind `policy_version` and run the drift gate
    against the weights of each row's own version. None: every row was generated by `policy_version`."""
    token_versions: list[list[int]] | None = None
    """(B, response_len_i) Trajectories.token_versions: per token, when an episode spans a weight update; the
    bound is checked on every token and the drift gate compares each token at its own version. None: every
    token carries its row's version."""


@dataclass(frozen=True, kw_only=True)
class UpdateStats:
    policy_version: int
    """Version of the weights AFTER this update."""
    loss: float
    pg_loss: float
    kl: float
    entropy: float
    clip_fraction: float
    grad_norm: float
    weights_checksum: str
    """Checksum of the updated weights (identical on every policy rank, checked by the group)."""
    drift: float
    """Mean |rollout logprob - policy logprob| over the batch's tokens at the batch's version, from the update's
    own first forward (before any optimizer step)."""
    compute_s: float
    applied: bool = True
    """False: a gate stopped the update before its optimizer step (drift above rl.drift_threshold or NaN, or a
    non-finite gradient norm; `stopped` says which): weights and version are unchanged."""
    stopped: str = ""
    mismatch_kl: float = 0.0
    """KL(rollout || trainer) at the batch's version, k3 estimate on the rollout's samples, per token."""
    mismatch_max: float = 0.0
    """max |trainer - rollout log-prob| over those tokens."""
    skipped_rows: int = 0
    """Rows the update did not run because they have no gradient (all-zero advantages and no KL term in the
    loss: `policy_group.rows_with_gradient`); entropy, clip fraction and drift are over the others."""


@dataclass(frozen=True, kw_only=True)
class PolicySums:
    """A policy rank's per-token sums over its shard's tokens in the first pass (the group divides the ranks'
    total by the group's tokens)."""

    pg: float
    """Policy-gradient term."""
    kl: float
    """KL term (0 without a reference)."""
    clip: float
    """Tokens whose ratio was clipped."""
    entropy: float
    mismatch_kl: float
    """k3 estimate of KL(trainer || rollout) summed over `mismatch_tokens` (rl.mismatch_correction's gap)."""
    mismatch_max: float
    """The largest per-token gap (a max, not a sum: the group takes the max)."""
    mismatch_tokens: float


@dataclass(frozen=True, kw_only=True)
class CriticSums:
    """A critic rank's per-token sums over its shard's tokens in the first pass."""

    clip: float
    """Tokens whose clipped value term was the larger."""
    values: float
    """The values themselves (their mean is a health signal)."""


@dataclass(frozen=True, kw_only=True)
class RankUpdate:
    """One SPMD training rank's answer to an update (policy or critic), reduced by its group: sums over the
    rank's shard in the first pass, and what every rank reports alike (version, checksum, gates)."""

    loss: float
    """Policy: this rank's part of the batch loss (the ranks' parts add up to it); critic: the sum of its
    tokens' value losses."""
    sums: PolicySums | CriticSums
    """The role's statistics summed over the rank's tokens: the group divides by the group's tokens."""
    tokens: int
    """Valid tokens of the rank's shard."""
    grad_norm: float
    version: int
    """Updates done after this one (unchanged when a gate stopped it)."""
    checksum: str
    applied: bool
    stopped: str
    compute_s: float
    drift: float = 0.0
    """Policy: the group's mean |rollout - policy log-prob| from the first forward."""
    values: list[list[float]] | None = None
    """Critic fit: the values of the shard's rows, in shard order."""


@dataclass(frozen=True, kw_only=True)
class WeightsHandle:
    """What the policy hands to weight sync: a version, a checksum and where the tensors are."""

    version: int
    checksum: str
    """posttrain.rl.weight_sync.weights_checksum of the state dict."""
    payload: Any
    """posttrain.rl.weight_transfer.SharedWeights (a file in shared memory on the rollout workers' node), a
    ray.ObjectRef to a dict[str, Tensor] (rollout workers on other nodes), or the dict itself (in-process groups)."""


@dataclass(frozen=True, kw_only=True)
class WeightReport:
    """A rollout worker's statement of what it holds after a weight sync."""

    worker: WorkerId
    version: int
    checksum: str
    """Computed from the weights the worker actually holds, not copied from the handle."""


@dataclass(frozen=True, kw_only=True)
class ModelPut:
    """What a policy checkpoint is stored as (`ArtifactStore.put` arguments) and where."""
    store_root: str
    name: str
    run_id: str
    parents: list[str]
    config: dict
    metrics: dict
    extra: dict
    provenance: dict
    """Written into the checkpoint as `posttrain_rl.json` (parents, step, version): deterministic, no
    timestamps, so an RL checkpoint is its own artifact even when its weights equal the start model's."""
