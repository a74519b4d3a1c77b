"""Groups that stand in for a role, built from other roles' groups after the actors start (rl.run applies
both, in this order): the policy's workers serving the reference (LoRA) or generating the rollouts
(placement.rollout_workers 0), and, with rl.environment / rl.tools, the rollout role running multi-turn
episodes through the environment role (EpisodeRollout). Which roles start at all is the registry's (ROLES)."""

from __future__ import annotations

from typing import Any

from posttrain.rl.roles import registry
from posttrain.rl.roles.registry import RunSettings, policy_generates, uses_episodes, uses_lora, uses_reference


def run_groups(ctx: registry.GroupContext, handles: dict[str, list], max_seq_len: int) -> dict[str, Any]:
    """Every role's group around its started workers (`handles`: Ray actors, or `LocalActor`s in one process),
    then the roles the policy serves and the episode rollout, in that order: what a run's controller drives."""
    groups = {role: registry.build_group(registry.ROLES[role], hs, ctx.ids[role], ctx) for role, hs in handles.items()}
    groups.update(served_by_policy(ctx.settings, groups))
    groups.update(episode_rollout(ctx.settings, groups, max_seq_len))
    return groups


def prompt_sampler(examples: list[dict], tokenizer, rl, rollout: Any, max_seq_len: int):
    """The run's PromptSampler: rows measured as their episodes open when `rollout` plays episodes (an episode's
    response holds every turn and the environment's answers: rl.episode.max_total_tokens), else as plain prompts
    (rl.max_new_tokens)."""
    from posttrain.rl.roles.episode_rollout import EpisodeRollout
    from posttrain.rl.state import PromptSampler

    episodes = isinstance(rollout, EpisodeRollout)
    return PromptSampler(examples, tokenizer, prompts_per_step=rl.prompts_per_step, seed=rl.seed,
                         episode_ids=rollout.prompt_ids if episodes else None,
                         max_prompt_len=max_seq_len - (rl.episode.max_total_tokens if episodes else rl.max_new_tokens))


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


def episode_rollout(s: RunSettings, groups: dict[str, Any], max_seq_len: int) -> dict[str, Any]:
    """With rl.environment / rl.tools, the rollout role runs multi-turn episodes through the environment role
    (episode_rollout.EpisodeRollout around the rollout group, or the policy ranks that generate); the layout is
    checked here, before any step: a chat template that cannot keep an episode's tokens is refused, naming it."""
    if not uses_episodes(s.rl):
        return {}
    from posttrain.envs.plan import checked_layout
    from posttrain.rl.roles.episode_rollout import EpisodeRollout

    layout = checked_layout(s.start_model_dir)
    env = groups["environment"]
    if s.reward.fn_weight == 0 and not s.reward.models and not env.rewards:
        raise ValueError(f"reward.fn_weight is 0 and rl.environment {s.rl.environment!r} gives no reward of its own "
                         "(no step rewards, no get_reward): the episodes would all score 0")
    return {"rollout": EpisodeRollout(groups["rollout"], env, layout, s.rl.episode, max_seq_len=max_seq_len)}
