"""The RL run's checks (config/checks.validate calls them): the reward, the RL algorithm and its settings, the
placement of its roles, and multi-turn episodes (whose settings eval.environment shares)."""

from __future__ import annotations

import math

from posttrain.config import check_base
from posttrain.config.algorithms import DECLARED, Algorithm, declared, read_by
from posttrain.config.check_base import NO_VLLM as _NO_VLLM
from posttrain.config.check_base import check as _check
from posttrain.config.check_base import is_import_path as _is_import_path
from posttrain.config.enums import MismatchCorrection, Parallelism, PlacementMode, RolloutBackend
from posttrain.config.sections import EpisodeConfig, ModelConfig, PlacementConfig, RewardConfig, RLConfig


def _check_rl_run(r: RLConfig, w: RewardConfig, p: PlacementConfig, m: ModelConfig, *, trained_model: bool) -> None:
    """Every check of the RL run's sections, in order: the algorithm and its settings, the reward, the placement of
    its roles, each role's own settings (multi-turn episodes: the environment role). A new role's checks join here,
    so config/checks.validate does not change."""
    _check_rl(r, m)
    _check_reward(w, trained_model=trained_model, environment=bool(r.environment))
    _check_placement(p, r)
    _check_episodes(r, m, p)


def _check_reward(w: RewardConfig, *, trained_model: bool = False, environment: bool = False) -> None:
    """`environment`: rl.environment is set - its own rewards may be the whole reward (reward.fn_weight 0; that
    it gives any is checked when its workers start: roles.episode_rollout.compose)."""
    _check(w.fn == "" or _is_import_path(w.fn), "reward.fn", "must look like 'module:function'")
    _check(w.timeout_s > 0, "reward.timeout_s", "must be > 0")
    _check(w.memory_mb >= 0, "reward.memory_mb", "must be >= 0 (0: no limit)")
    _check(w.cpu_s >= 0, "reward.cpu_s", "must be >= 0 (0: no limit)")
    _check(all(isinstance(p, str) and p.strip() for p in w.python_path), "reward.python_path",
           "entries must be non-empty folder paths")
    if w.python_path:
        _check(bool(w.fn), "reward.python_path", "only means something with reward.fn set")
    _check(all(isinstance(m, str) and m.strip() for m in w.models), "reward.models",
           "entries must be artifact ids, channel:NAME or folders")
    _check(not w.model_weights or len(w.model_weights) == len(w.models), "reward.model_weights",
           f"needs one weight per reward.models entry ({len(w.models)}), got {len(w.model_weights)}")
    _check(all(math.isfinite(x) for x in w.model_weights), "reward.model_weights", "must be finite")
    _check(math.isfinite(w.fn_weight) and w.fn_weight >= 0, "reward.fn_weight", "must be a finite number >= 0")
    models = bool(w.models) or trained_model or environment
    _check(w.fn_weight > 0 or models, "reward.fn_weight",
           "0 leaves no reward: set reward.models (or run rlhf_pipeline, which trains one), rl.environment, or a "
           "weight > 0")
    _check(w.fn_weight == 1.0 or models, "reward.fn_weight",
           "only means something with reward.models or rl.environment set (the function is the whole reward "
           "otherwise)")


def _used_only_by(r: RLConfig, name: str, algorithms: tuple[Algorithm, ...], why: str = "") -> None:
    """A setting that only some algorithms read must keep its default under the others."""
    _check(r.algorithm in algorithms or getattr(r, name) == getattr(RLConfig(), name), f"rl.{name}",
           "only means something with rl.algorithm " + " / ".join(repr(a.value) for a in algorithms) +
           f" (this run: {r.algorithm.value!r})" + (f": {why}" if why else ""))


def _check_rl(r: RLConfig, m: ModelConfig) -> None:
    _check(r.steps >= 1, "rl.steps", "must be >= 1")
    _check(r.prompts_per_step >= 1, "rl.prompts_per_step", "must be >= 1")
    algo = declared(r.algorithm)
    _check(not algo.groups or r.samples_per_prompt >= 2
           or (bool(algo.groups_off_at_zero) and getattr(r, algo.groups_off_at_zero) == 0),
           "rl.samples_per_prompt", f"must be >= 2 ({r.algorithm.value!r} compares each sample with its group)")
    _check(r.samples_per_prompt >= 1, "rl.samples_per_prompt", "must be >= 1")
    _check(r.temperature > 0, "rl.temperature", "must be > 0")
    _check(r.max_new_tokens >= 1, "rl.max_new_tokens", "must be >= 1")
    _check(r.max_new_tokens < m.max_seq_len, "rl.max_new_tokens",
           f"must be < model.max_seq_len = {m.max_seq_len} (prompt and completion share it)")
    _check(0 < r.top_p <= 1, "rl.top_p", "must be in (0, 1]")
    _check(r.top_k >= 0, "rl.top_k", "must be >= 0 (0: no limit)")
    _check(0 <= r.max_reward_failure_rate <= 1, "rl.max_reward_failure_rate", "must be in [0, 1]")
    _check(r.lr > 0, "rl.lr", "must be > 0")
    _check(r.warmup_steps >= 0, "rl.warmup_steps", "must be >= 0")
    _check(r.inner_epochs >= 1, "rl.inner_epochs", "must be >= 1")
    _check(r.mini_batches >= 1, "rl.mini_batches", "must be >= 1")
    _check(r.micro_batch_size >= 1, "rl.micro_batch_size", "must be >= 1")
    _check(0 < r.clip_low < 1, "rl.clip_low", "must be in (0, 1)")
    _check(r.clip_high > 0, "rl.clip_high", "must be > 0")
    _check(r.clip_ratio_c == 0 or r.clip_ratio_c > 1, "rl.clip_ratio_c", "must be 0 (off) or > 1")
    _check(r.kl_coef >= 0, "rl.kl_coef", "must be >= 0")
    _check(r.checkpoint_every >= 0, "rl.checkpoint_every", "must be >= 0")
    _check(r.drift_threshold > 0, "rl.drift_threshold", "must be > 0")
    _check(r.mismatch_cap > 1, "rl.mismatch_cap", "must be > 1")
    _check(r.mismatch_correction != MismatchCorrection.OFF or r.mismatch_cap == RLConfig().mismatch_cap,
           "rl.mismatch_cap", "only means something with rl.mismatch_correction set (this run: 'off')")
    _check(r.remote_timeout_s > 0, "rl.remote_timeout_s", "must be > 0")
    _check(r.step_timeout_s > 0, "rl.step_timeout_s", "must be > 0")
    _check(r.max_restarts >= 0, "rl.max_restarts", "must be >= 0")
    _check(r.rollout_backend != RolloutBackend.VLLM or check_base.vllm_installed(), "rl.rollout_backend", _NO_VLLM)
    _check_rl_algorithm(r)


_READ_BY = read_by()
"""rl.* setting -> (the algorithms that read it, why the others do not), from the algorithms' declarations: under
any other algorithm it must keep its default (a setting that does nothing is refused)."""


def _check_rl_algorithm(r: RLConfig) -> None:
    """The settings of particular algorithms: read only by them, and their ranges."""
    for name, (algorithms, why) in _READ_BY.items():
        _used_only_by(r, name, algorithms, why)
    _check(0 <= r.gamma <= 1, "rl.gamma", "must be in [0, 1]")
    _check(0 <= r.lam <= 1, "rl.lam", "must be in [0, 1]")
    _check(r.critic_lr > 0, "rl.critic_lr", "must be > 0")
    _check(r.critic_warmup_steps >= 0, "rl.critic_warmup_steps", "must be >= 0")
    _check(r.critic_warmup_steps < r.steps, "rl.critic_warmup_steps",
           f"must be < rl.steps = {r.steps} (the policy would never train)")
    _check(r.value_clip > 0, "rl.value_clip", "must be > 0")
    _check(not r.kl_in_reward or r.kl_coef > 0, "rl.kl_in_reward", "needs rl.kl_coef > 0")
    _check(r.max_extra_draws >= 0, "rl.max_extra_draws", "must be >= 0")
    _check(0 <= r.overlong_buffer <= r.max_new_tokens, "rl.overlong_buffer",
           f"must be in [0, rl.max_new_tokens = {r.max_new_tokens}] (0: off)")
    _check(r.overlong_penalty >= 0, "rl.overlong_penalty", "must be >= 0")
    algo = declared(r.algorithm)
    _check(not algo.teacher or bool(r.teacher.strip()), "rl.teacher",
           f"{r.algorithm.value} needs a teacher: an artifact id, a local HF folder or channel:NAME")
    _check(r.distill_reward_weight >= 0, "rl.distill_reward_weight", "must be >= 0")
    if algo.clip is not None:
        _check(max(r.clip_low, r.clip_high) <= algo.clip.largest, "rl.clip_low / rl.clip_high",
               f"{algo.clip.why}: {r.clip_low} / {r.clip_high} would almost never clip; the paper uses "
               f"{algo.defaults['clip_low'].value:g} / {algo.defaults['clip_high'].value:g} "
               f"({r.algorithm.value}'s defaults: leave both unset to take them)")


def _check_episodes(r: RLConfig, m: ModelConfig, p: PlacementConfig) -> None:
    """rl.environment / rl.tools and their limits (rl.episode)."""
    _check_episode_settings("rl", r.environment, r.tools, r.episode, r.max_new_tokens, m)
    _check(p.environment_workers >= 1, "placement.environment_workers", "must be >= 1")
    _check(p.environment_workers == 1 or bool(r.environment or r.tools), "placement.environment_workers",
           "only means something with rl.environment or rl.tools set")
    _check(not r.new_weights_between_turns or (r.max_staleness > 0 and bool(r.environment or r.tools)),
           "rl.new_weights_between_turns", "only applies to multi-turn episodes (rl.environment or rl.tools) "
           "generated ahead of the update (rl.max_staleness > 0): otherwise no update happens during an episode")
    if r.environment or r.tools:
        _check(r.overlong_buffer == 0, "rl.overlong_buffer",
               "must be 0 with multi-turn episodes: DAPO's overlong punishment reads one completion's length")
        # each later turn samples only the episodes still going: fewer than the ranks, and a sharded policy's
        # gather (every rank must enter it) would wait for ranks that were given none
        _check(p.rollout_workers >= 1 or r.parallelism != Parallelism.FSDP2 or p.policy_workers == 1,
               "placement.rollout_workers", "0 (the policy ranks generate) with rl.parallelism 'fsdp2' and several "
               "policy workers cannot run multi-turn episodes: a turn with fewer episodes going than ranks leaves "
               "ranks out of the sharded model's gather; use rollout workers or rl.parallelism 'ddp'")


def _check_episode_settings(section: str, environment: str, tools: list[str], e: EpisodeConfig,
                            max_new_tokens: int, m: ModelConfig) -> None:
    """`section`.environment / .tools and their limits (`section`.episode): rl's or eval's."""
    _check(environment == "" or _is_import_path(environment), f"{section}.environment", "must look like 'module:Class'")
    for i, t in enumerate(tools):
        _check(isinstance(t, str) and _is_import_path(t), f"{section}.tools[{i}]",
               f"must look like 'module:function', got {t!r}")
    _check(len(set(tools)) == len(tools), f"{section}.tools", "names a function twice")
    if not (environment or tools):
        for name in EpisodeConfig.__dataclass_fields__:
            _check(getattr(e, name) == getattr(EpisodeConfig(), name), f"{section}.episode.{name}",
                   f"only means something with {section}.environment or {section}.tools set")
        return
    _check(all(isinstance(x, str) and x.strip() for x in e.python_path), f"{section}.episode.python_path",
           "entries must be non-empty folder paths")
    _check(e.max_turns >= 1, f"{section}.episode.max_turns", "must be >= 1")
    _check(e.max_env_tokens >= 1, f"{section}.episode.max_env_tokens", "must be >= 1")
    _check(e.max_total_tokens >= max_new_tokens, f"{section}.episode.max_total_tokens",
           f"must be >= {section}.max_new_tokens = {max_new_tokens} (room for one sampled turn)")
    _check(e.max_total_tokens < m.max_seq_len, f"{section}.episode.max_total_tokens",
           f"must be < model.max_seq_len = {m.max_seq_len} (the prompt and the whole episode share it)")
    _check(e.tool_timeout_s > 0, f"{section}.episode.tool_timeout_s", "must be > 0")
    _check(e.tool_cpu_s >= 0, f"{section}.episode.tool_cpu_s", "must be >= 0 (0: no limit)")
    _check(e.tool_memory_mb >= 0, f"{section}.episode.tool_memory_mb", "must be >= 0 (0: no limit)")
    _check(e.max_result_chars >= 1, f"{section}.episode.max_result_chars", "must be >= 1")


def _check_placement(p: PlacementConfig, r: RLConfig) -> None:
    _check(p.policy_workers >= 1, "placement.policy_workers", "must be >= 1")
    _check(p.rollout_workers >= 0, "placement.rollout_workers", "must be >= 0 (0: the policy ranks generate)")
    if p.rollout_workers == 0:
        _check(r.rollout_backend == RolloutBackend.TRANSFORMERS, "placement.rollout_workers",
               f"0 (the policy ranks generate) needs rl.rollout_backend 'transformers', not "
               f"'{RolloutBackend(r.rollout_backend).value}': vLLM runs in rollout workers of its own")
        _check(p.mode == PlacementMode.COLOCATED, "placement.mode",
               "'split' gives rollout workers devices of their own, but placement.rollout_workers is 0 "
               "(the policy ranks generate)")
    _check(r.max_staleness >= 0, "rl.max_staleness", "must be >= 0 (0: synchronous)")
    _check(r.max_staleness == 0 or p.rollout_workers >= 1, "rl.max_staleness",
           f"{r.max_staleness} generates ahead of the update, in rollout workers of their own, but "
           "placement.rollout_workers is 0 (the policy ranks generate, so they cannot update at the same time)")
    _check(0 < r.ahead_drift_fraction <= 1, "rl.ahead_drift_fraction", "must be in (0, 1] (1: every row)")
    _check(r.ahead_drift_fraction == RLConfig.ahead_drift_fraction or r.max_staleness > 0, "rl.ahead_drift_fraction",
           "only applies to samples generated ahead (rl.max_staleness > 0); the synchronous loop's drift gate "
           "measures every row at no cost")
    _check(r.policy_generate_batch >= 0, "rl.policy_generate_batch", "must be >= 0 (0: all rows at once)")
    _check(r.policy_generate_batch == 0 or p.rollout_workers == 0, "rl.policy_generate_batch",
           f"sizes the policy ranks' own generation, but placement.rollout_workers is {p.rollout_workers}: rollout "
           "workers generate (set placement.rollout_workers 0, or leave rl.policy_generate_batch 0)")
    _check(p.reference_workers >= 1, "placement.reference_workers", "must be >= 1")
    _check(p.reward_workers >= 1, "placement.reward_workers", "must be >= 1")
    _check(p.critic_workers >= 0, "placement.critic_workers", "must be >= 0 (0: as many as policy_workers)")
    _check(p.reward_model_workers >= 1, "placement.reward_model_workers", "must be >= 1")
    _check(p.teacher_workers >= 1, "placement.teacher_workers", "must be >= 1")
    _check(p.critic_workers == 0 or declared(r.algorithm).critic, "placement.critic_workers",
           "only means something with rl.algorithm " + " / ".join(repr(a.value) for a in DECLARED
                                                                 if DECLARED[a].critic))
    _check(p.torch_threads >= 1, "placement.torch_threads", "must be >= 1")
    _check(p.rollout_threads >= 0, "placement.rollout_threads", "must be >= 0 (0: the same as torch_threads)")
    _check(p.malloc_arena_max >= 0, "placement.malloc_arena_max", "must be >= 0 (0: glibc's default)")
    _check(p.gpus_per_worker >= 0, "placement.gpus_per_worker", "must be >= 0")
    batch = r.prompts_per_step * r.samples_per_prompt
    _check(batch >= p.policy_workers, "rl.prompts_per_step",
           f"prompts_per_step * samples_per_prompt = {batch} must be >= placement.policy_workers")
    _check(batch >= r.mini_batches * max(p.policy_workers, p.critic_workers), "rl.mini_batches",
           f"prompts_per_step * samples_per_prompt = {batch} must give every mini-batch at least one sequence "
           f"per rank (rl.mini_batches = {r.mini_batches}, placement.policy_workers = {p.policy_workers})")
