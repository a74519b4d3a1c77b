"""Every RL algorithm, named and declared in one place: the `Algorithm` enum (what `rl.algorithm` takes) and
`DECLARED`, what the config layer knows of each - the rl settings only some algorithms read, the published
defaults, the roles beyond the common ones, the group comparison and a bound on the clip range.

Everything else derives from here: `validate`'s algorithm checks (checks.py), the defaults the plan takes
(algorithm_defaults.py), the roles a run starts (rl/roles/registry.py: the critic, the teacher) and the settings
reference (docs/settings.md). The loop that runs an algorithm is the rl layer's: `rl/loops/__init__.py::ALGORITHMS`
maps each member to its loop class. Adding an algorithm: a member and its declaration here, its loop class in
rl/loops/ and its row in ALGORITHMS (a test checks that every member has both).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Algorithm(enum.Enum):
    GRPO = "grpo"  # group-normalised outcome advantages (Shao et al. 2024)
    PPO = "ppo"  # a critic, GAE (Schulman et al. 2017)
    RLOO = "rloo"  # leave-one-out group baseline (Ahmadian et al. 2024)
    REINFORCE_PP = "reinforce_pp"  # token returns with the KL in the reward, whitened over the batch (Hu 2025)
    DR_GRPO = "dr_grpo"  # GRPO without std normalisation, constant token normaliser (Liu et al. 2025)
    GSPO = "gspo"  # length-normalised sequence-level ratio and clipping (Zheng et al. 2025)
    DAPO = "dapo"  # clip-higher, dynamic sampling, soft overlong punishment, token-mean loss (Yu et al. 2025)
    ON_POLICY_DISTILL = "on_policy_distill"  # per-token reverse KL to a teacher as the advantage (Agarwal 2024)


@dataclass(frozen=True)
class Default:
    value: object
    """The value the setting takes under the algorithm when the user did not set it."""
    source: str
    """Where the number comes from."""


@dataclass(frozen=True)
class ClipBound:
    largest: float
    """The largest rl.clip_low / rl.clip_high that still clips this algorithm's ratio."""
    why: str
    """Why (said when a larger value is refused)."""


@dataclass(frozen=True, kw_only=True)
class Declared:
    reads: tuple[str, ...] = ()
    """The rl settings only some algorithms read that this one reads. Under an algorithm that does not read a
    setting it must keep RLConfig's default (a setting that does nothing is refused)."""
    skips: dict[str, str] = field(default_factory=dict)
    """rl settings the other algorithms read that this one does not -> why."""
    defaults: dict[str, Default] = field(default_factory=dict)
    """rl setting -> its published default, taken when the user did not set it (algorithm_defaults.py). Listed
    only where the paper (or the standard implementation) prescribes a number RLConfig's default does not give."""
    groups: bool = True
    """Each sample is compared with the other samples of its prompt: rl.samples_per_prompt must be >= 2."""
    groups_off_at_zero: str = ""
    """An rl setting at whose 0 the comparison is off (on-policy distillation without the task's reward)."""
    critic: bool = False
    """Trains a critic (the `critic` role; placement.critic_workers)."""
    teacher: bool = False
    """Reads a teacher's log-probs (the `teacher` role; rl.teacher must name one)."""
    clip: ClipBound | None = None
    """A bound on the clip range, or None."""


_PPO_SETTINGS = ("kl_in_reward", "lam", "critic_lr", "critic_warmup_steps", "critic_init", "value_clip")
_DAPO_SETTINGS = ("max_extra_draws", "overlong_buffer", "overlong_penalty")

DECLARED: dict[Algorithm, Declared] = {
    Algorithm.GRPO: Declared(reads=("std_normalize",)),
    Algorithm.PPO: Declared(reads=(*_PPO_SETTINGS, "gamma"), groups=False, critic=True),
    Algorithm.RLOO: Declared(),
    Algorithm.REINFORCE_PP: Declared(reads=("gamma",), groups=False),
    Algorithm.DR_GRPO: Declared(skips={"loss_agg": "dr_grpo and gspo aggregate their own way"}),
    Algorithm.GSPO: Declared(
        reads=("std_normalize",),
        skips={"loss_agg": "dr_grpo and gspo aggregate their own way",
               "clip_ratio_c": "gspo clips a sequence-level ratio, without dual-clip"},
        defaults={"clip_low": Default(3e-4, "Zheng et al. 2025 (GSPO), experimental setup: left clipping range 3e-4"),
                  "clip_high": Default(4e-4,
                                       "Zheng et al. 2025 (GSPO), experimental setup: right clipping range 4e-4")},
        clip=ClipBound(0.05, "gspo clips the sequence-level ratio, whose deviations from 1 are ~1e-3")),
    Algorithm.DAPO: Declared(
        reads=("std_normalize", *_DAPO_SETTINGS),
        # RLConfig's clip defaults are DAPO's clip-higher; declared so a DAPO run keeps them whatever they become
        defaults={"clip_low": Default(0.2, "Yu et al. 2025 (DAPO), Clip-Higher: eps_low 0.2"),
                  "clip_high": Default(0.28, "Yu et al. 2025 (DAPO), Clip-Higher: eps_high 0.28")}),
    Algorithm.ON_POLICY_DISTILL: Declared(reads=("std_normalize", "teacher", "distill_reward_weight"),
                                          groups_off_at_zero="distill_reward_weight", teacher=True),
}
"""rl.algorithm -> its declaration (module docstring)."""


def declared(algorithm: Algorithm) -> Declared:
    return DECLARED[algorithm]


def read_by() -> dict[str, tuple[tuple[Algorithm, ...], str]]:
    """rl setting -> (the algorithms that read it, why the others do not), for every setting some algorithm does
    not read; algorithms in the enum's order."""
    table: dict[str, tuple[tuple[Algorithm, ...], str]] = {}
    for name in dict.fromkeys(n for d in DECLARED.values() for n in d.reads):
        table[name] = (tuple(a for a in Algorithm if name in DECLARED[a].reads), "")
    for name in dict.fromkeys(n for d in DECLARED.values() for n in d.skips):
        why = "; ".join(dict.fromkeys(d.skips[name] for d in DECLARED.values() if name in d.skips))
        table[name] = (tuple(a for a in Algorithm if name not in DECLARED[a].skips), why)
    return table
