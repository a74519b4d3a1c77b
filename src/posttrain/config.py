"""Typed configuration for the whole post-training pipeline.

One `PipelineConfig` describes a run end to end (data -> SFT -> RL -> eval), but every Flyte task receives
only its own part (plus the run id), so that changing, say, an RL setting does not change the inputs -
and therefore the cache keys - of the data-prep or SFT stages.

All classes are frozen, keyword-only dataclasses: flytekit passes them between tasks as typed values, and
nothing can mutate a config after `validate()` has accepted it. Each field is documented by the string
literal under it. Recipes (`posttrain.recipes`) are functions that return a `PipelineConfig`;
`apply_overrides` edits one with JSON, and `validate` rejects every bad value or combination with a
message naming the field and what is allowed - before any work starts.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import typing
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """An invalid configuration value; the message names the field and what is allowed."""


# --------------------------------------------------------------------------------------------- enums


class DataFormat(enum.Enum):
    AUTO = "auto"
    JSONL = "jsonl"
    PARQUET = "parquet"
    CSV = "csv"
    SAVED = "saved"  # a folder written by datasets.Dataset.save_to_disk


class DataSchema(enum.Enum):
    MESSAGES = "messages"  # a list of {"role", "content"} chat turns
    PROMPT_COMPLETION = "prompt_completion"  # SFT pairs
    PROMPT_ANSWER = "prompt_answer"  # RL/eval prompts with a reference answer


class Arch(enum.Enum):
    LLAMA = "llama"
    QWEN2 = "qwen2"


class DType(enum.Enum):
    FP32 = "fp32"
    BF16 = "bf16"  # autocast on GPU; CPU training stays fp32


class Parallelism(enum.Enum):
    DDP = "ddp"
    FSDP2 = "fsdp2"


class Backend(enum.Enum):
    AUTO = "auto"  # nccl when CUDA is available, gloo otherwise
    GLOO = "gloo"
    NCCL = "nccl"


class Algorithm(enum.Enum):
    GRPO = "grpo"
    PPO = "ppo"


class KLEstimator(enum.Enum):
    K1 = "k1"  # log(p/q)
    K2 = "k2"  # 0.5 * log(p/q)^2
    K3 = "k3"  # exp(-log(p/q)) - 1 + log(p/q)  (unbiased, non-negative)


class LossAgg(enum.Enum):
    TOKEN_MEAN = "token_mean"  # mean over all response tokens of the global batch
    SEQ_MEAN = "seq_mean"  # mean over sequences of each sequence's token mean


class PlacementMode(enum.Enum):
    COLOCATED = "colocated"  # roles share the same devices and take turns by phase
    SPLIT = "split"  # each role gets its own devices


class RolloutBackend(enum.Enum):
    TRANSFORMERS = "transformers"
    VLLM = "vllm"


# --------------------------------------------------------------------------------------------- parts


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    train: bool = True
    """Train a byte-level BPE tokenizer on the data (needed when the model is built from scratch)."""
    vocab_size: int = 320
    """Target vocabulary size of the trained tokenizer (>= 260: 256 bytes plus special tokens)."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    task: str = "addition"
    """Built-in synthetic task ("addition" or "chain"), or "" to load `files`."""
    files: list[str] = field(default_factory=list)
    """Local data files (jsonl, parquet, csv) or one `save_to_disk` folder; used when `task` is ""."""
    format: DataFormat = DataFormat.AUTO
    """File format; AUTO picks it from each file's extension (a folder means SAVED)."""
    schema: DataSchema = DataSchema.PROMPT_COMPLETION
    """How rows map to examples: chat messages, prompt+completion, or prompt+reference answer."""
    messages_field: str = "messages"
    """Column holding the chat turns (schema MESSAGES)."""
    prompt_field: str = "prompt"
    """Column holding the prompt text (schemas PROMPT_COMPLETION and PROMPT_ANSWER)."""
    completion_field: str = "completion"
    """Column holding the target completion (schema PROMPT_COMPLETION)."""
    answer_field: str = "answer"
    """Column holding the reference answer (schema PROMPT_ANSWER)."""
    answer_marker: str = ""
    """If set (GSM8K: "####"), the reference answer is the text after the last marker in the answer or
    completion field."""
    num_examples: int = 20000
    """Synthetic tasks: number of problems generated (before de-duplication and the split)."""
    num_digits: int = 3
    """addition: digits per operand (zero-padded; the answer has num_digits + 1 digits)."""
    chain_steps: int = 3
    """chain: number of dependent operations, each shown with its intermediate result."""
    eval_size: int = 500
    """Number of held-out examples in the eval split (taken after de-duplication)."""
    max_prompt_chars: int = 4096
    """Rows whose prompt is longer than this many characters are rejected with an error."""
    dedupe: bool = True
    """Drop exact duplicate examples (same prompt and target) before splitting."""
    seed: int = 0
    """Seed for synthetic generation and the train/eval split."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Tokenizer trained on the data for from-scratch models."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    base_path: str = ""
    """A local HF model folder (safetensors) to start from; "" builds a tiny model from scratch."""
    arch: Arch = Arch.LLAMA
    """Architecture of a from-scratch model."""
    hidden_size: int = 128
    """From scratch: width of the residual stream."""
    num_layers: int = 2
    """From scratch: number of transformer blocks."""
    num_heads: int = 4
    """From scratch: attention heads (must divide hidden_size)."""
    num_kv_heads: int = 4
    """From scratch: key/value heads (must divide num_heads)."""
    intermediate_size: int = 512
    """From scratch: MLP width."""
    max_seq_len: int = 64
    """Longest sequence (prompt + completion, in tokens) the model trains or generates on."""
    dtype: DType = DType.FP32
    """Compute dtype; BF16 means autocast on GPU (CPU always trains in fp32)."""
    init_seed: int = 0
    """Seed for from-scratch weight initialisation."""


@dataclass(frozen=True, kw_only=True)
class TrackingConfig:
    wandb_mode: str = "offline"
    """wandb mode: "offline" (default, writes under the run folder), "online" or "disabled"."""
    wandb_project: str = "posttrain"
    """wandb project name."""
    log_every: int = 10
    """Print a console line every this many steps (a progress bar shows every step when interactive)."""


@dataclass(frozen=True, kw_only=True)
class SFTConfig:
    steps: int = 300
    """Optimizer steps."""
    global_batch_size: int = 64
    """Examples per optimizer step, summed over ranks and micro-batches."""
    micro_batch_size: int = 32
    """Examples per forward/backward on one rank; accumulation = global / (micro * nproc)."""
    lr: float = 3e-3
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio."""
    warmup_steps: int = 20
    """Linear warm-up steps."""
    weight_decay: float = 0.01
    """AdamW weight decay (not applied to norms and biases)."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold (global L2 norm); 0 disables clipping."""
    packing: bool = True
    """Pack several examples into one row (isolated by a block-diagonal mask, restarting positions)."""
    pack_length: int = 0
    """Tokens per packed row; 0 means model.max_seq_len."""
    parallelism: Parallelism = Parallelism.DDP
    """Data parallelism: DDP, or FSDP2 (fully_shard) for larger models."""
    nproc: int = 2
    """Processes per node. Fixed when the Elastic task is defined (POSTTRAIN_SFT_NPROC): must agree."""
    backend: Backend = Backend.AUTO
    """torch.distributed backend."""
    save_every: int = 100
    """Save resumable training state every this many steps (0: only at the end)."""
    epochs_limit: int = 0
    """Unused when 0; otherwise stop after this many passes over the data even if steps remain."""
    seed: int = 0
    """Seed for data order and dropout-free training randomness."""


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    num_problems: int = 500
    """Held-out problems scored (at most the eval split; 0 means the whole split)."""
    k: int = 4
    """Samples per problem for sampled accuracy and pass@k."""
    temperature: float = 1.0
    """Sampling temperature for the k samples (greedy accuracy is reported separately)."""
    max_new_tokens: int = 16
    """Generation limit per answer."""
    batch_size: int = 256
    """Prompts per generation batch."""
    seed: int = 0
    """Sampling seed."""
    reward_fn: str = ""
    """Optional user scoring function "module:function" (default: the task's verifier)."""


@dataclass(frozen=True, kw_only=True)
class RLConfig:
    enabled: bool = True
    """Run the RL stage after SFT."""
    algorithm: Algorithm = Algorithm.GRPO
    """Policy-gradient algorithm (PPO needs a critic role: not implemented yet)."""
    steps: int = 60
    """Policy updates (one rollout batch each)."""
    prompts_per_step: int = 64
    """Prompts sampled per step."""
    samples_per_prompt: int = 8
    """Completions per prompt (the GRPO group size)."""
    temperature: float = 1.0
    """Rollout sampling temperature."""
    max_new_tokens: int = 16
    """Rollout generation limit."""
    lr: float = 3e-5
    """Policy learning rate (AdamW, constant after warm-up). Fresh Adam moves every weight by ~lr per step,
    so RL on a tiny model needs a small one: 5e-4 collapsed the tiny_cpu model within 10 steps (measured)."""
    warmup_steps: int = 0
    """Linear warm-up steps for the policy learning rate."""
    inner_epochs: int = 1
    """Passes over each rollout batch (clipped importance ratio after the first)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward on one policy rank."""
    clip_low: float = 0.2
    """Lower clip range: ratio >= 1 - clip_low."""
    clip_high: float = 0.28
    """Upper clip range: ratio <= 1 + clip_high."""
    kl_coef: float = 0.0
    """KL penalty to the reference model; 0 means no reference role is created."""
    kl_estimator: KLEstimator = KLEstimator.K3
    """KL estimator used for the penalty."""
    loss_agg: LossAgg = LossAgg.TOKEN_MEAN
    """How token losses aggregate over the global batch."""
    std_normalize: bool = True
    """Divide group-centred rewards by the group's std (Dr. GRPO leaves this off)."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold; 0 disables."""
    reward_fn: str = ""
    """User reward function "module:function"; "" uses the task's verifier."""
    reward_timeout_s: float = 5.0
    """Per-call time limit for a user reward function (it runs in a separate process)."""
    checkpoint_every: int = 20
    """Save a model artifact and the training state every this many steps (0: only at the end)."""
    drift_threshold: float = 0.05
    """Fail when mean |rollout logprob - policy logprob| over the same tokens exceeds this."""
    remote_timeout_s: float = 300.0
    """Timeout for every remote call to a role worker; the error names the stage and the worker."""
    rollout_backend: RolloutBackend = RolloutBackend.TRANSFORMERS
    """Generation engine for rollouts (vLLM needs a separate install)."""
    seed: int = 0
    """Seed for prompt sampling and rollout sampling."""


@dataclass(frozen=True, kw_only=True)
class PlacementConfig:
    mode: PlacementMode = PlacementMode.COLOCATED
    """COLOCATED: roles share devices, taking turns by phase. SPLIT: each role on its own devices."""
    policy_workers: int = 2
    """Ranks in the SPMD policy group. Fixed in the Ray task's `train` worker group on a cluster."""
    rollout_workers: int = 1
    """Generation workers (the `rollout` worker group on a cluster)."""
    reference_workers: int = 1
    """Reference log-prob workers (only created when rl.kl_coef > 0)."""
    reward_workers: int = 1
    """Reward scoring workers."""
    gpus_per_worker: float = 0.0
    """GPUs per role worker (0 on CPU). In COLOCATED mode roles share each device."""


@dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    name: str = "tiny_cpu"
    """Recipe name, recorded in manifests."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


# --------------------------------------------------------------------------------------------- JSON


def to_dict(cfg: typing.Any) -> typing.Any:
    """A JSON-ready dict of a config (enums become their values); used in manifests and cache keys."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, enum.Enum):
        return cfg.value
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    return cfg


def from_dict(cls: type, data: dict, path: str = "") -> typing.Any:
    """Build config class `cls` from a dict, naming the field path of any unknown key or bad type."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or cls.__name__}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{path or cls.__name__}: unknown field(s) {unknown}; allowed: {sorted(names)}")
    kwargs = {k: _coerce(hints[k], v, f"{path}.{k}" if path else k) for k, v in data.items()}
    return cls(**kwargs)


def _coerce(tp: typing.Any, value: typing.Any, path: str) -> typing.Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        allowed = [m.value for m in tp]
        if value not in allowed:
            raise ConfigError(f"{path}: {value!r} is not one of {allowed}")
        return tp(value)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)
        return [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp in (int, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(f"{path}: expected {tp.__name__}, got {value!r}")
        return value
    return value


def apply_overrides(cfg: PipelineConfig, overrides: str | dict) -> PipelineConfig:
    """Return `cfg` with JSON overrides merged in, e.g. '{"sft": {"steps": 500}}'."""
    if isinstance(overrides, str):
        if not overrides.strip():
            return cfg
        try:
            overrides = json.loads(overrides)
        except json.JSONDecodeError as e:
            raise ConfigError(f"overrides: not valid JSON ({e})") from None
    merged = _deep_merge(to_dict(cfg), overrides)
    return from_dict(PipelineConfig, merged)


def _deep_merge(base: dict, over: dict) -> dict:
    if not isinstance(over, dict):
        raise ConfigError(f"overrides: expected a JSON object, got {type(over).__name__}")
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


# --------------------------------------------------------------------------------------------- checks


def _check(ok: bool, field_path: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{field_path}: {message}")


def validate(cfg: PipelineConfig) -> PipelineConfig:
    """Reject invalid values and combinations; returns `cfg` unchanged when it is valid."""
    d, m, s, e, r, p = cfg.data, cfg.model, cfg.sft, cfg.eval, cfg.rl, cfg.placement
    # data
    _check(d.task in ("", "addition", "chain"), "data.task", f"{d.task!r} is not one of 'addition', 'chain', ''")
    _check(bool(d.task) != bool(d.files), "data.files",
           "give either a built-in data.task or data.files (set data.task to \"\" to use files)")
    _check(d.num_examples >= 2, "data.num_examples", "must be >= 2")
    _check(1 <= d.num_digits <= 12, "data.num_digits", "must be between 1 and 12")
    _check(1 <= d.chain_steps <= 8, "data.chain_steps", "must be between 1 and 8")
    _check(d.eval_size >= 1, "data.eval_size", "must be >= 1")
    _check(d.max_prompt_chars >= 1, "data.max_prompt_chars", "must be >= 1")
    _check(d.tokenizer.vocab_size >= 260, "data.tokenizer.vocab_size", "must be >= 260 (256 bytes + specials)")
    if d.task:
        _check(d.eval_size < d.num_examples, "data.eval_size", "must be smaller than data.num_examples")
    # model
    if not m.base_path:
        _check(d.tokenizer.train, "data.tokenizer.train",
               "must be true when model.base_path is empty (a from-scratch model needs a tokenizer)")
    for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_seq_len"):
        _check(getattr(m, name) >= 1, f"model.{name}", "must be >= 1")
    _check(m.hidden_size % m.num_heads == 0, "model.num_heads", f"must divide model.hidden_size={m.hidden_size}")
    _check(m.num_heads % m.num_kv_heads == 0, "model.num_kv_heads", f"must divide model.num_heads={m.num_heads}")
    # sft
    _check(s.steps >= 1, "sft.steps", "must be >= 1")
    _check(s.nproc >= 1, "sft.nproc", "must be >= 1")
    _check(s.micro_batch_size >= 1, "sft.micro_batch_size", "must be >= 1")
    _check(s.global_batch_size % (s.micro_batch_size * s.nproc) == 0, "sft.global_batch_size",
           f"must be a multiple of sft.micro_batch_size * sft.nproc = {s.micro_batch_size * s.nproc}")
    _check(s.lr > 0, "sft.lr", "must be > 0")
    _check(0 <= s.min_lr_ratio <= 1, "sft.min_lr_ratio", "must be in [0, 1]")
    _check(0 <= s.warmup_steps < s.steps, "sft.warmup_steps", "must be in [0, sft.steps)")
    _check(s.max_grad_norm >= 0, "sft.max_grad_norm", "must be >= 0")
    _check(s.save_every >= 0, "sft.save_every", "must be >= 0")
    _check(s.pack_length == 0 or s.pack_length >= 8, "sft.pack_length", "must be 0 (model.max_seq_len) or >= 8")
    # eval
    _check(e.num_problems >= 0, "eval.num_problems", "must be >= 0 (0: the whole eval split)")
    _check(e.k >= 1, "eval.k", "must be >= 1")
    _check(e.temperature > 0, "eval.temperature", "must be > 0")
    _check(e.max_new_tokens >= 1, "eval.max_new_tokens", "must be >= 1")
    _check(e.batch_size >= 1, "eval.batch_size", "must be >= 1")
    _check(e.reward_fn == "" or _is_import_path(e.reward_fn), "eval.reward_fn", "must look like 'module:function'")
    # rl
    _check(r.algorithm == Algorithm.GRPO, "rl.algorithm", "only 'grpo' is implemented (PPO needs the critic role)")
    _check(r.steps >= 1, "rl.steps", "must be >= 1")
    _check(r.prompts_per_step >= 1, "rl.prompts_per_step", "must be >= 1")
    _check(r.samples_per_prompt >= 2, "rl.samples_per_prompt", "must be >= 2 (GRPO needs a group)")
    _check(r.temperature > 0, "rl.temperature", "must be > 0")
    _check(r.max_new_tokens >= 1, "rl.max_new_tokens", "must be >= 1")
    _check(r.lr > 0, "rl.lr", "must be > 0")
    _check(r.inner_epochs >= 1, "rl.inner_epochs", "must be >= 1")
    _check(r.micro_batch_size >= 1, "rl.micro_batch_size", "must be >= 1")
    _check(0 < r.clip_low < 1, "rl.clip_low", "must be in (0, 1)")
    _check(r.clip_high > 0, "rl.clip_high", "must be > 0")
    _check(r.kl_coef >= 0, "rl.kl_coef", "must be >= 0")
    _check(r.reward_timeout_s > 0, "rl.reward_timeout_s", "must be > 0")
    _check(r.checkpoint_every >= 0, "rl.checkpoint_every", "must be >= 0")
    _check(r.drift_threshold > 0, "rl.drift_threshold", "must be > 0")
    _check(r.remote_timeout_s > 0, "rl.remote_timeout_s", "must be > 0")
    _check(r.reward_fn == "" or _is_import_path(r.reward_fn), "rl.reward_fn", "must look like 'module:function'")
    # placement
    _check(p.policy_workers >= 1, "placement.policy_workers", "must be >= 1")
    _check(p.rollout_workers >= 1, "placement.rollout_workers", "must be >= 1")
    _check(p.reference_workers >= 1, "placement.reference_workers", "must be >= 1")
    _check(p.reward_workers >= 1, "placement.reward_workers", "must be >= 1")
    _check(p.gpus_per_worker >= 0, "placement.gpus_per_worker", "must be >= 0")
    batch = r.prompts_per_step * r.samples_per_prompt
    _check(batch >= p.policy_workers, "rl.prompts_per_step",
           f"prompts_per_step * samples_per_prompt = {batch} must be >= placement.policy_workers")
    # tracking
    _check(cfg.tracking.wandb_mode in ("offline", "online", "disabled"), "tracking.wandb_mode",
           f"{cfg.tracking.wandb_mode!r} is not one of 'offline', 'online', 'disabled'")
    _check(cfg.tracking.log_every >= 1, "tracking.log_every", "must be >= 1")
    return cfg


def _is_import_path(s: str) -> bool:
    mod, sep, fn = s.partition(":")
    return bool(sep) and all(p.isidentifier() for p in mod.split(".")) and fn.isidentifier()
