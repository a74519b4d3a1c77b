"""`validate`: reject every bad value or combination before any work starts, naming the field and what is
allowed. One function per config section; cross-section rules live with the section whose field is wrong."""

from __future__ import annotations

from posttrain.config import check_base
from posttrain.config.check_base import NO_VLLM as _NO_VLLM
from posttrain.config.check_base import VLLM_INSTALL_COMMAND, vllm_installed  # noqa: F401 - re-exported
from posttrain.config.check_base import check as _check
from posttrain.config.dense import DistillConfig, DPOConfig, PairsConfig
from posttrain.config.enums import (
    DataSchema,
    DistillLoss,
    DPOLoss,
    RolloutBackend,
)
from posttrain.config.pipeline import PipelineConfig
from posttrain.config.rl_checks import _check_episode_settings, _check_rl_run
from posttrain.config.sections import (
    BUILTIN_TASKS,
    DataConfig,
    EvalConfig,
    ModelConfig,
    PassRateConfig,
    RLConfig,
    SFTConfig,
    TrackingConfig,
)

DENSE = ("pairs", "dpo", "reward_model", "distill", "rlhf", "pass_rate")
"""Sections a workflow may use beyond data/model/sft/eval/rl; "rlhf": RL gets the reward model the workflow
trains (rlhf_pipeline), so reward.fn_weight 0 leaves RL a reward; "pass_rate": the workflow selects RL's prompts
by the start model's pass rate when data.pass_rate.enabled (pipeline)."""
"""The sections only some workflows use (dpo_pipeline: pairs + dpo, ...): `validate(cfg, sections=...)` checks
those named; the others are left alone, so e.g. a 4-rank SFT run need not also fit DPO's batch to 4 ranks."""


def validate(cfg: PipelineConfig, sections: tuple[str, ...] = DENSE) -> PipelineConfig:
    """Reject invalid values and combinations; returns `cfg` unchanged when it is valid. `sections`: which of
    DENSE the run uses (default: all of them), and "agent" for agent_pipeline (RL and evaluation must each
    name an environment or tools)."""
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
    _check_pass_rate(cfg.data.pass_rate, cfg.rl, selects="pass_rate" in sections)
    _check_eval(cfg.eval, cfg.model)
    _check_rl_run(cfg.rl, cfg.reward, cfg.placement, cfg.model, trained_model="rlhf" in sections)
    if "agent" in sections:  # agent_pipeline: RL and both evaluations play in an environment
        for name, section in (("rl", cfg.rl), ("eval", cfg.eval)):
            _check(bool(section.environment or section.tools), f"{name}.environment",
                   f"agent_pipeline trains and evaluates in an environment: set {name}.environment (or "
                   f"{name}.tools), e.g. \"posttrain.envs.builtin:Calculator\" as the tiny_calculator recipe does")
    _check_tracking(cfg.tracking)
    return cfg


def _check_data(d: DataConfig) -> None:
    _check(d.task in ("", *BUILTIN_TASKS), "data.task", f"{d.task!r} is not one of {['', *BUILTIN_TASKS]}")
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
    _check(d.demo_error_rate == 0 or d.task in ("addition", "calculator", "calculator_lazy", "guess_number"),
           "data.demo_error_rate", "only the built-in addition, calculator(_lazy) and guess_number tasks have sloppy "
           "demonstrations")
    _check(d.task != "guess_number" or not d.dedupe, "data.dedupe",
           "must be false with data.task guess_number: its demonstrations repeat by design (one game per secret "
           "and guesser, the share of sloppy games is what SFT imitates), so de-duplication would keep ~64 rows")
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
    _check(s.tokens >= 0, f"{name}.tokens", "must be >= 0 (0: the budget is steps)")
    if s.tokens:
        _check(s.steps == 0, f"{name}.steps",
               f"must be 0 when {name}.tokens is set (the steps are then worked out from the token budget): "
               f"set one of the two")
    else:
        _check(s.steps >= 1, f"{name}.steps", f"must be >= 1 (or 0 with a token budget in {name}.tokens)")
    nproc = s.nproc or sft_nproc or 1
    _check(s.nproc >= 1 or sft_nproc is not None, f"{name}.nproc", "must be >= 1")
    _check(s.micro_batch_size >= 1, f"{name}.micro_batch_size", "must be >= 1")
    _check(s.global_batch_size % (s.micro_batch_size * nproc) == 0, f"{name}.global_batch_size",
           f"must be a multiple of {name}.micro_batch_size * {name}.nproc = {s.micro_batch_size * nproc}")
    _check(s.lr > 0, f"{name}.lr", "must be > 0")
    _check(0 <= s.min_lr_ratio <= 1, f"{name}.min_lr_ratio", "must be in [0, 1]")
    _check(s.warmup_steps >= 0 and (s.tokens or s.warmup_steps < s.steps), f"{name}.warmup_steps",
           f"must be in [0, {name}.steps)")  # under a token budget, checked once the steps are known
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
    _check(p.backend != RolloutBackend.VLLM or check_base.vllm_installed(), "pairs.backend", _NO_VLLM)


def _check_pass_rate(p: PassRateConfig, r: RLConfig, *, selects: bool) -> None:
    """`selects`: the workflow runs the selection (pipeline)."""
    if not p.enabled:
        for name in PassRateConfig.__dataclass_fields__:
            _check(getattr(p, name) == getattr(PassRateConfig(), name), f"data.pass_rate.{name}",
                   "only means something with data.pass_rate.enabled")
        return
    _check(selects, "data.pass_rate.enabled", "this workflow selects no prompts: the `pipeline` workflow does, "
           "before RL")
    _check(r.enabled, "data.pass_rate.enabled", "rl.enabled is false: no RL step would train on the selection")
    _check(not (r.environment or r.tools), "data.pass_rate.enabled",
           "not with rl.environment / rl.tools: a prompt's pass rate over multi-turn episodes is not measured")
    _check(p.samples_per_prompt >= 2, "data.pass_rate.samples_per_prompt", "must be >= 2")
    _check(0.0 <= p.min_rate < p.max_rate <= 1.0, "data.pass_rate.min_rate",
           f"needs 0 <= min_rate < max_rate <= 1, got {p.min_rate} and {p.max_rate}")
    _check(any(p.min_rate < k / p.samples_per_prompt < p.max_rate for k in range(p.samples_per_prompt + 1)),
           "data.pass_rate.max_rate", f"no rate a prompt can have with {p.samples_per_prompt} samples lies strictly "
           f"between {p.min_rate} and {p.max_rate}: every prompt would be left out")
    _check(p.max_prompts >= 0, "data.pass_rate.max_prompts", "must be >= 0 (0: every train prompt)")
    _check(p.batch_size >= 1, "data.pass_rate.batch_size", "must be >= 1")
    _check(p.backend != RolloutBackend.VLLM or check_base.vllm_installed(), "data.pass_rate.backend", _NO_VLLM)
    _check(p.refresh_every >= 0, "data.pass_rate.refresh_every", "must be >= 0 (0: no refresh)")
    _check(p.refresh_every < r.steps, "data.pass_rate.refresh_every",
           f"{p.refresh_every} >= rl.steps = {r.steps}: the first refresh would come after the last step")
    _check(not (p.refresh_every and r.max_staleness), "data.pass_rate.refresh_every",
           f"not with rl.max_staleness = {r.max_staleness}: draws generated ahead would come from the prompts "
           "kept before a refresh")


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
    _check(e.backend != RolloutBackend.VLLM or check_base.vllm_installed(), "eval.backend", _NO_VLLM)
    _check_episode_settings("eval", e.environment, e.tools, e.episode, e.max_new_tokens, m)


def _check_tracking(t: TrackingConfig) -> None:
    _check(t.wandb_mode != "disabled", "tracking.wandb_mode",
           "'disabled' is not a mode: set tracking.wandb to false to start no wandb run")
    _check(t.wandb_mode in ("offline", "online"), "tracking.wandb_mode",
           f"{t.wandb_mode!r} is not one of 'offline', 'online'")
    _check(t.log_every >= 0, "tracking.log_every", "must be >= 0 (0: lines paced by tracking.progress_every_s)")
    _check(t.progress_every_s > 0, "tracking.progress_every_s", "must be > 0 seconds")
