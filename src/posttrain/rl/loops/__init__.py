"""RL algorithms as loops over named role groups, each step read top to bottom: grpo.py (GRPO), family.py
(RLOO, Dr. GRPO, GSPO: GRPO's step with another baseline or objective), reinforce_pp.py, dapo.py (GRPO's step
with dynamic sampling and the overlong penalty), ppo.py (a critic), distill.py (on-policy distillation: a
teacher's per-token log-probs).

ALGORITHMS maps `rl.algorithm` to its loop ("module:Class") and the phases its step runs, in order (the RL
page stacks the phase times in this order). A loop class has `Roles`, a frozen dataclass naming the role
groups it reads (the controller fills it from the run's groups by field name; an optional role is a field
with a default), and `step(prompts, run) -> StepOutcome` (loops/common.py). An algorithm's published defaults
for rl settings (gspo's clip range, ...) are config, applied at plan: posttrain.config.algorithm_defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.rl.roles.registry import scoring_roles


@dataclass(frozen=True, kw_only=True)
class AlgorithmSpec:
    loop: str
    """"module:Class" of the loop."""
    phases: tuple[str, ...]
    """The phases of one step in the order they run (`run.phase(name)`; "sync" is the controller's)."""


SCORE_PHASES = ("reward", *scoring_roles())
"""The reward functions, then every scoring role of the registry (loops.common.score)."""
GROUP_PHASES = ("rollout", *SCORE_PHASES, "reference", "advantages", "update", "sync")
"""A critic-free step: GRPO, its family, REINFORCE++."""

ALGORITHMS: dict[str, AlgorithmSpec] = {
    "grpo": AlgorithmSpec(loop="posttrain.rl.loops.grpo:GRPO", phases=GROUP_PHASES),
    "ppo": AlgorithmSpec(loop="posttrain.rl.loops.ppo:PPO",
                         phases=("rollout", *SCORE_PHASES, "reference", "values", "advantages", "critic", "update",
                                 "sync")),
    "rloo": AlgorithmSpec(loop="posttrain.rl.loops.family:RLOO", phases=GROUP_PHASES),
    "dr_grpo": AlgorithmSpec(loop="posttrain.rl.loops.family:DrGRPO", phases=GROUP_PHASES),
    "gspo": AlgorithmSpec(loop="posttrain.rl.loops.family:GSPO", phases=GROUP_PHASES),
    "reinforce_pp": AlgorithmSpec(loop="posttrain.rl.loops.reinforce_pp:ReinforcePP", phases=GROUP_PHASES),
    "dapo": AlgorithmSpec(loop="posttrain.rl.loops.dapo:DAPO", phases=GROUP_PHASES),
    "on_policy_distill": AlgorithmSpec(loop="posttrain.rl.loops.distill:OnPolicyDistill",
                                       phases=("rollout", *SCORE_PHASES, "reference", "teacher", "advantages",
                                               "update", "sync")),
}
