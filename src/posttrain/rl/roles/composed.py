"""Groups that stand in for a role, built from other roles' groups after the actors start (rl.run applies
both, in this order): the policy's workers serving the reference (LoRA) or generating the rollouts
(placement.rollout_workers 0), and, with rl.environment / rl.tools, the rollout role running multi-turn
episodes through the environment role (EpisodeRollout). Which roles start at all is the registry's (ROLES)."""

from __future__ import annotations

from typing import Any

from posttrain.rl.roles.registry import RunSettings, policy_generates, uses_episodes, uses_lora, uses_reference


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
