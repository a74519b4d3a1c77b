"""RL algorithms as loops over named role groups, each step read top to bottom: grpo.py (GRPO), family.py
(RLOO, Dr. GRPO, GSPO: GRPO's step with another baseline or objective), reinforce_pp.py, dapo.py (GRPO's step
with dynamic sampling and the overlong penalty), ppo.py (a critic), distill.py (on-policy distillation: a
teacher's per-token log-probs).

ALGORITHMS maps `rl.algorithm` to its loop class and the phases its step runs, in order (the RL page stacks the
phase times in this order). A loop class has `Roles`, a frozen dataclass naming the role groups it reads (the
controller fills it from the run's groups by field name; an optional role is a field with a default), and
`step(prompts, run) -> StepOutcome` (loops/common.py). What the config knows of an algorithm - the settings only
it reads, its published defaults (gspo's clip range, ...), its critic or teacher - is declared with its enum
member (posttrain.config.algorithms); a row here is the other place an algorithm is named.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.config import Algorithm
from posttrain.rl.loops.common import Loop
from posttrain.rl.loops.dapo import DAPO
from posttrain.rl.loops.distill import OnPolicyDistill
from posttrain.rl.loops.family import GSPO, RLOO, DrGRPO
from posttrain.rl.loops.grpo import GRPO
from posttrain.rl.loops.ppo import PPO
from posttrain.rl.loops.reinforce_pp import ReinforcePP
from posttrain.rl.roles.registry import scoring_roles


@dataclass(frozen=True, kw_only=True)
class AlgorithmSpec:
    loop: type[Loop]
    """The loop class: `loop(cfg, loop.Roles(...))` (controller.make_algorithm)."""
    phases: tuple[str, ...]
    """The phases of one step in the order they run (`run.phase(name)`; "sync" is the controller's)."""


SCORE_PHASES = ("reward", *scoring_roles())
"""The reward functions, then every scoring role of the registry (loops.common.score)."""
GROUP_PHASES = ("rollout", *SCORE_PHASES, "reference", "advantages", "update", "sync")
"""A critic-free step: GRPO, its family, REINFORCE++."""

ALGORITHMS: dict[Algorithm, AlgorithmSpec] = {
    Algorithm.GRPO: AlgorithmSpec(loop=GRPO, phases=GROUP_PHASES),
    Algorithm.PPO: AlgorithmSpec(loop=PPO, phases=("rollout", *SCORE_PHASES, "reference", "values", "advantages",
                                                   "critic", "update", "sync")),
    Algorithm.RLOO: AlgorithmSpec(loop=RLOO, phases=GROUP_PHASES),
    Algorithm.DR_GRPO: AlgorithmSpec(loop=DrGRPO, phases=GROUP_PHASES),
    Algorithm.GSPO: AlgorithmSpec(loop=GSPO, phases=GROUP_PHASES),
    Algorithm.REINFORCE_PP: AlgorithmSpec(loop=ReinforcePP, phases=GROUP_PHASES),
    Algorithm.DAPO: AlgorithmSpec(loop=DAPO, phases=GROUP_PHASES),
    Algorithm.ON_POLICY_DISTILL: AlgorithmSpec(loop=OnPolicyDistill,
                                               phases=("rollout", *SCORE_PHASES, "reference", "teacher", "advantages",
                                                       "update", "sync")),
}
