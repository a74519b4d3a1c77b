"""Groups that stand in for a role, built from other roles' groups after the actors start (rl.run applies
both, in this order): the policy's workers serving the reference (LoRA) or generating the rollouts
(placement.rollout_workers 0), then each active role's own stand-ins (its registry row's `compose`: with
rl.environment / rl.tools, the rollout role running multi-turn episodes through the environment role). Which roles
start at all is the registry's (ROLES)."""

from __future__ import annotations

from typing import Any

from posttrain.rl.roles import registry
from posttrain.rl.roles.protocols import ShapesPrompts
from posttrain.rl.roles.registry import RunSettings, policy_generates, uses_lora, uses_reference


def run_groups(ctx: registry.GroupContext, handles: dict[str, list], max_seq_len: int) -> dict[str, Any]:
    """Every role's group around its started workers (`handles`: Ray actors, or `LocalActor`s in one process),
    then the roles the policy serves, then the active roles' stand-ins, in ROLES order: what a run's controller
    drives."""
    groups = {role: registry.build_group(registry.ROLES[role], hs, ctx.ids[role], ctx) for role, hs in handles.items()}
    groups.update(served_by_policy(ctx.settings, groups))
    groups.update(registry.stand_ins(ctx.settings, groups, max_seq_len))
    return groups


def prompt_sampler(examples: list[dict], tokenizer, rl, rollout: Any, max_seq_len: int):
    """The run's PromptSampler: rows as the rollout opens them when it shapes its own prompts (ShapesPrompts:
    an episode's tools turn, its room for every turn), else as plain prompts with rl.max_new_tokens of room."""
    from posttrain.rl.state import PromptSampler

    if isinstance(rollout, ShapesPrompts):
        return PromptSampler(examples, tokenizer, prompts_per_step=rl.prompts_per_step, seed=rl.seed,
                             prompt_of=rollout.prompt_of, encode=rollout.prompt_ids,
                             max_prompt_len=max_seq_len - rollout.response_room,
                             room_setting=rollout.response_room_setting)
    return PromptSampler(examples, tokenizer, prompts_per_step=rl.prompts_per_step, seed=rl.seed,
                         max_prompt_len=max_seq_len - rl.max_new_tokens)


def served_by_policy(s: RunSettings, groups: dict[str, Any]) -> dict[str, Any]:
    """Roles the policy workers answer themselves instead of workers of their own: with `model.lora` and
    rl.kl_coef > 0 the reference is the policy's model with its adapters off (reference.PolicyBaseReference);
    with placement.rollout_workers 0 the policy ranks generate the rollouts (rollout.PolicyRollout)."""
    served = {}
    if uses_reference(s.rl) and uses_lora(s):
        from posttrain.rl.roles.reference import PolicyBaseReference

        served["reference"] = PolicyBaseReference(groups["policy"])
    if policy_generates(s):
        from posttrain.rl.roles.rollout import PolicyRollout

        served["rollout"] = PolicyRollout(groups["policy"])
    return served
