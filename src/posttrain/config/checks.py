"""`validate`: reject every bad value or combination before any work starts, naming the field and what is
allowed. One function per config section; cross-section rules live with the section whose field is wrong."""

from __future__ import annotations

import importlib.util
import math

from posttrain.config.algorithms import DECLARED, Algorithm, declared, read_by
from posttrain.config.dense import DistillConfig, DPOConfig, PairsConfig
from posttrain.config.enums import (
    DataSchema,
    DistillLoss,
    DPOLoss,
    MismatchCorrection,
    Parallelism,
    PlacementMode,
    RolloutBackend,
)
from posttrain.config.errors import ConfigError
from posttrain.config.pipeline import PipelineConfig
from posttrain.config.sections import (
    DataConfig,
    EpisodeConfig,
    EvalConfig,
    ModelConfig,
    PlacementConfig,
    RewardConfig,
    RLConfig,
    SFTConfig,
    TrackingConfig,
)

DENSE = ("pairs", "dpo", "reward_model", "distill", "rlhf")
"""Sections a workflow may use beyond data/model/sft/eval/rl; "rlhf": RL gets the reward model the workflow
trains (rlhf_pipeline), so reward.fn_weight 0 leaves RL a reward."""
"""The sections only some workflows use (dpo_pipeline: pairs + dpo, ...): `validate(cfg, sections=...)` checks
those named; the others are left alone, so e.g. a 4-rank SFT run need not also fit DPO's batch to 4 ranks."""


def validate(cfg: PipelineConfig, sections: tuple[str, ...] = DENSE) -> PipelineConfig:
    """Reject invalid values and combinations; returns `cfg` unchanged when it is valid. `sections`: which of
    DENSE the run uses (default: all of them)."""
    _check_data(cfg.data)
    _check_model(cfg.model, cfg.data)
    _check_sft(cfg.sft, cfg.model)
    if "dpo" in sections:
        _check_trainer(cfg.dpo, "dpo", cfg.sft.nproc)
        _check_dpo(cfg.dpo)
    if "reward_model" in sections:
        _check_trainer(cfg.reward_model, "reward_model", cfg.sft.nproc)
        _check(cfg.reward_model.center_rewards_coef >= 0, "reward_model.center_rewards_coef", "must be >= 0")
    if "distill" in sections:
        _check_trainer(cfg.distill, "distill", cfg.sft.nproc)
        _check_distill(cfg.distill)
    if "pairs" in sections:
        _check_pairs(cfg.pairs, cfg.model)
    _check_eval(cfg.eval, cfg.model)
    _check_rl(cfg.rl, cfg.model)
    _check_reward(cfg.reward, trained_model="rlhf" in sections, environment=bool(cfg.rl.environment))
    _check_placement(cfg.placement, cfg.rl)
    _check_episodes(cfg.rl, cfg.model, cfg.placement)
    _check_tracking(cfg.tracking)
    return cfg


def _check(ok: bool, field_path: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{field_path}: {message}")


def _check_data(d: DataConfig) -> None:
    _check(d.task in ("", "addition", "chain"), "data.task", f"{d.task!r} is not one of 'addition', 'chain', ''")
    _check(bool(d.task) != bool(d.files), "data.files",
           "give either a built-in data.task or data.files (set data.task to \"\" to use files)")
    _check(d.num_examples >= 2, "data.num_examples", "must be >= 2")
    _check(1 <= d.num_digits <= 12, "data.num_digits", "must be between 1 and 12")
    _check(1 <= d.chain_steps <= 8, "data.chain_steps", "must be between 1 and 8")
    if d.eval_files:
        _check(not d.task, "data.eval_files", "only with data.files (set data.task to \"\")")
        _check(d.eval_size == 0, "data.eval_size",
               "must be 0 when data.eval_files is given (the eval files are the eval split, used as given)")
    else:
        _check(d.eval_size >= 1, "data.eval_size", "must be >= 1 (or give data.eval_files)")
    _check(0 <= d.demo_error_rate < 1, "data.demo_error_rate", "must be in [0, 1)")
    if d.task:
        _check(d.schema != DataSchema.PREFERENCE or d.task == "addition", "data.schema",
               f"'preference' with a built-in task: only 'addition' comes as pairs, not {d.task!r}")
        _check(d.schema != DataSchema.PREFERENCE or d.demo_error_rate == 0, "data.demo_error_rate",
               "the 'addition' pairs already set the correct sum against the sloppy one: set it to 0")
    _check(d.demo_error_rate == 0 or d.task == "addition", "data.demo_error_rate",
           "only the built-in addition task has sloppy demonstrations (data.task=\"addition\")")
    _check(d.max_prompt_chars >= 1, "data.max_prompt_chars", "must be >= 1")
    _check(d.tokenizer.vocab_size >= 260, "data.tokenizer.vocab_size", "must be >= 260 (256 bytes + specials)")
    if d.task:
        _check(d.eval_size < d.num_examples, "data.eval_size", "must be smaller than data.num_examples")
    if d.schema == DataSchema.PREFERENCE:
        _check(bool(d.chosen_field), "data.chosen_field", "must name the column of preferred completions")
        _check(bool(d.rejected_field), "data.rejected_field", "must name the column of dispreferred completions")
        _check(d.chosen_field != d.rejected_field, "data.rejected_field",
               f"must differ from data.chosen_field ({d.chosen_field!r})")
        for name in ("prompt_field", "answer_field"):
            _check(getattr(d, name) not in (d.chosen_field, d.rejected_field), f"data.{name}",
                   f"{getattr(d, name)!r} is also data.chosen_field or data.rejected_field")


def _check_model(m: ModelConfig, d: DataConfig) -> None:
    _check(not (m.base_path and m.artifact), "model.artifact", "give model.base_path or model.artifact, not both")
    if m.base_path or m.artifact:
        _check(not d.tokenizer.train, "data.tokenizer.train",
               "must be false when starting from a pretrained model (it brings its own tokenizer)")
    else:
        _check(d.tokenizer.train, "data.tokenizer.train",
               "must be true when model.base_path is empty (a from-scratch model needs a tokenizer)")
    for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_seq_len"):
        _check(getattr(m, name) >= 1, f"model.{name}", "must be >= 1")
    _check(m.hidden_size % m.num_heads == 0, "model.num_heads", f"must divide model.hidden_size={m.hidden_size}")
    _check(m.num_heads % m.num_kv_heads == 0, "model.num_kv_heads", f"must divide model.num_heads={m.num_heads}")
    if m.lora is not None:
        _check(m.lora.rank >= 1, "model.lora.rank", "must be >= 1")
        _check(m.lora.alpha > 0, "model.lora.alpha", "must be > 0")
        _check(0 <= m.lora.dropout < 1, "model.lora.dropout", "must be in [0, 1)")
        _check(bool(m.lora.target_modules), "model.lora.target_modules",
               "must name at least one linear layer (e.g. [\"q_proj\", \"v_proj\"])")
        _check(len(set(m.lora.target_modules)) == len(m.lora.target_modules), "model.lora.target_modules",
               "names a layer twice")


def _check_sft(s: SFTConfig, m: ModelConfig) -> None:
    if not s.enabled:
        _check(bool(m.base_path or m.artifact), "sft.enabled",
               "false needs a model to start from: set model.base_path (a local HF folder) or model.artifact")
    _check_trainer(s, "sft")


def _check_trainer(s: SFTConfig, name: str, sft_nproc: int | None = None) -> None:
    """The trainer settings every dense objective shares, named under its section (sft, dpo, ...)."""
    if sft_nproc is not None:  # a dense objective beside SFT: nproc 0 means sft.nproc (recipes.same_ranks)
        _check(s.nproc in (0, sft_nproc), f"{name}.nproc",
               f"must equal sft.nproc = {sft_nproc} (or 0: the same): every dense objective's task runs on the same "
               f"Elastic group (POSTTRAIN_SFT_NPROC processes per node)")
    _check(s.steps >= 1, f"{name}.steps", "must be >= 1")
    nproc = s.nproc or sft_nproc or 1
    _check(s.nproc >= 1 or sft_nproc is not None, f"{name}.nproc", "must be >= 1")
    _check(s.micro_batch_size >= 1, f"{name}.micro_batch_size", "must be >= 1")
    _check(s.global_batch_size % (s.micro_batch_size * nproc) == 0, f"{name}.global_batch_size",
           f"must be a multiple of {name}.micro_batch_size * {name}.nproc = {s.micro_batch_size * nproc}")
    _check(s.lr > 0, f"{name}.lr", "must be > 0")
    _check(0 <= s.min_lr_ratio <= 1, f"{name}.min_lr_ratio", "must be in [0, 1]")
    _check(0 <= s.warmup_steps < s.steps, f"{name}.warmup_steps", f"must be in [0, {name}.steps)")
    _check(s.max_grad_norm >= 0, f"{name}.max_grad_norm", "must be >= 0")
    _check(s.save_every >= 0, f"{name}.save_every", "must be >= 0")
    _check(s.pack_length == 0 or s.pack_length >= 8, f"{name}.pack_length", "must be 0 (model.max_seq_len) or >= 8")


def _check_dpo(d: DPOConfig) -> None:
    _check(d.beta > 0, "dpo.beta", "must be > 0")
    _check(0 <= d.label_smoothing < 0.5, "dpo.label_smoothing", "must be in [0, 0.5)")
    _check(d.label_smoothing == 0 or d.loss == DPOLoss.SIGMOID, "dpo.label_smoothing",
           f"only applies to the 'sigmoid' loss, not {d.loss.value!r}: set it to 0")
    _check(d.sft_weight >= 0, "dpo.sft_weight", "must be >= 0")


def _check_distill(d: DistillConfig) -> None:
    _check(d.temperature > 0, "distill.temperature", "must be > 0")
    _check(0 < d.beta < 1 or d.loss != DistillLoss.JSD, "distill.beta",
           "must be in (0, 1) for the 'jsd' loss (0 and 1 are forward_kl and reverse_kl)")
    _check(d.beta == DistillConfig.beta or d.loss == DistillLoss.JSD, "distill.beta",
           f"only applies to the 'jsd' loss, not {d.loss.value!r}: leave it at its default")


def _check_pairs(p: PairsConfig, m: ModelConfig) -> None:
    _check(p.samples_per_prompt >= 2, "pairs.samples_per_prompt", "must be >= 2 (a pair needs two samples)")
    _check(p.temperature > 0, "pairs.temperature", "must be > 0 (greedy samples are all the same)")
    _check(0 < p.top_p <= 1, "pairs.top_p", "must be in (0, 1]")
    _check(p.top_k >= 0, "pairs.top_k", "must be >= 0 (0: no limit)")
    _check(p.max_new_tokens >= 1, "pairs.max_new_tokens", "must be >= 1")
    _check(p.max_new_tokens < m.max_seq_len, "pairs.max_new_tokens",
           f"must be < model.max_seq_len = {m.max_seq_len} (prompt and completion share it)")
    _check(p.max_prompts >= 0, "pairs.max_prompts", "must be >= 0 (0: every train prompt)")
    _check(p.eval_prompts >= 0, "pairs.eval_prompts", "must be >= 0 (0: every eval prompt)")
    _check(p.batch_size >= 1, "pairs.batch_size", "must be >= 1")
    _check(p.backend != RolloutBackend.VLLM or vllm_installed(), "pairs.backend", _NO_VLLM)


def _check_eval(e: EvalConfig, m: ModelConfig) -> None:
    _check(e.num_problems >= 0, "eval.num_problems", "must be >= 0 (0: the whole eval split)")
    _check(e.k >= 0, "eval.k", "must be >= 0 (0: greedy accuracy only)")
    _check(e.temperature > 0, "eval.temperature", "must be > 0")
    _check(0 < e.top_p <= 1, "eval.top_p", "must be in (0, 1]")
    _check(e.top_k >= 0, "eval.top_k", "must be >= 0 (0: no limit)")
    _check(e.max_new_tokens >= 1, "eval.max_new_tokens", "must be >= 1")
    _check(e.max_new_tokens < m.max_seq_len, "eval.max_new_tokens",
           f"must be < model.max_seq_len = {m.max_seq_len} (prompt and completion share it)")
    _check(e.batch_size >= 1, "eval.batch_size", "must be >= 1")
    _check(e.backend != RolloutBackend.VLLM or vllm_installed(), "eval.backend", _NO_VLLM)
    _check_episode_settings("eval", e.environment, e.tools, e.episode, e.max_new_tokens, m)
    _check(e.backend == RolloutBackend.TRANSFORMERS or not (e.environment or e.tools), "eval.backend",
           "must be 'transformers' with eval.environment or eval.tools: episodes are evaluated on the transformers "
           "engine (vLLM's turn-by-turn episodes are not yet tested)")


def _check_reward(w: RewardConfig, *, trained_model: bool = False, environment: bool = False) -> None:
    """`environment`: rl.environment is set - its own rewards may be the whole reward (reward.fn_weight 0; that
    it gives any is checked when its workers start: roles.composed.episode_rollout)."""
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
    _check(r.rollout_backend != RolloutBackend.VLLM or vllm_installed(), "rl.rollout_backend", _NO_VLLM)
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


def _check_tracking(t: TrackingConfig) -> None:
    _check(t.wandb_mode != "disabled", "tracking.wandb_mode",
           "'disabled' is not a mode: set tracking.wandb to false to start no wandb run")
    _check(t.wandb_mode in ("offline", "online"), "tracking.wandb_mode",
           f"{t.wandb_mode!r} is not one of 'offline', 'online'")
    _check(t.log_every >= 0, "tracking.log_every", "must be >= 0 (0: lines paced by tracking.progress_every_s)")
    _check(t.progress_every_s > 0, "tracking.progress_every_s", "must be > 0 seconds")


VLLM_INSTALL_COMMAND = "make install-vllm"
"""vLLM is an optional extra in its own environment (.venv-vllm, pinned by requirements-vllm.lock)."""


_NO_VLLM = (f"'vllm' needs vLLM, which is not installed in this environment; install it with "
            f"`{VLLM_INSTALL_COMMAND}` (its own environment, .venv-vllm) and run with `make run-vllm`")


def vllm_installed() -> bool:
    """Whether `import vllm` would find a package: looked up, not imported (importing it takes seconds).
    Every local task runs in the Python that validates the config, so this is where the run would need it."""
    return importlib.util.find_spec("vllm") is not None


def _is_import_path(s: str) -> bool:
    mod, sep, fn = s.partition(":")
    return bool(sep) and all(p.isidentifier() for p in mod.split(".")) and fn.isidentifier()
