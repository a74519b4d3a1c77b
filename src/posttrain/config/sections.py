"""The config sections, one frozen dataclass per pipeline part (the RL stage's three - reward, rl, placement -
are in rl_sections.py and re-exported here).

Every field is documented by the string literal under it; `posttrain.config.checks.validate` holds the
rules on which values and combinations are allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from posttrain.config.enums import (
    Arch,
    Backend,
    DataFormat,
    DataSchema,
    DType,
    Parallelism,
    RolloutBackend,
)
from posttrain.config.rl_sections import EpisodeConfig, PlacementConfig, RewardConfig, RLConfig  # noqa: F401 - re-exported


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    train: bool = True
    """Train a byte-level BPE tokenizer on the data (needed when the model is built from scratch)."""
    vocab_size: int = 320
    """Target vocabulary size of the trained tokenizer (>= 260: 256 bytes plus special tokens)."""
    split_words: bool = True
    """Split text at word boundaries before BPE (GPT-2's regex), so no token spans two words. False lets BPE
    merge across them: text that every example repeats - the tools block an environment task shows in its
    system turn, the fixed parts of a tool call - becomes a few tokens (the calculator task: 60 tokens per
    demonstration against 235), which is what lets a tiny model train on it in minutes. Digits stay one per
    token either way."""


BUILTIN_TASKS = ("addition", "chain", "calculator", "calculator_lazy", "guess_number")
"""The built-in tasks: `addition` and `chain` (posttrain.data.synthetic), `calculator` (and `calculator_lazy`, its
teacher skipping the tool on any problem) played with a tool and `guess_number` played over several turns
(posttrain.envs.tasks)."""


@dataclass(frozen=True, kw_only=True)
class PassRateConfig:
    """Prompt selection by pass rate (`data.pass_rate`, the `pipeline` workflow): before RL, the start model (the
    SFT model) samples `samples_per_prompt` answers to each train prompt with RL's sampling settings
    (rl.temperature, rl.top_p, rl.top_k, rl.max_new_tokens); each is scored by the reward function or verifier
    (score >= 1 passes), and RL trains only on the prompts whose pass rate lies strictly between `min_rate` and
    `max_rate` - by default those neither always nor never solved, the ones whose GRPO groups give a gradient.
    The kept prompts are a `dataset` artifact (parents: the start model and the dataset; every sampled prompt's
    rate in its info.json), cached on both and in the RL model's lineage. The eval split is kept whole."""
    enabled: bool = False
    """Select the RL prompts by the start model's pass rate."""
    samples_per_prompt: int = 8
    """Answers sampled per prompt (k): rates are multiples of 1/k."""
    min_rate: float = 0.0
    """Prompts with a pass rate at or below this are left out (0.0: the never-solved ones)."""
    max_rate: float = 1.0
    """Prompts with a pass rate at or above this are left out (1.0: the always-solved ones)."""
    max_prompts: int = 0
    """Train prompts sampled (the first ones of the train split; only those can be kept); 0: all of them."""
    batch_size: int = 256
    """Prompts per generation batch (transformers engine)."""
    backend: RolloutBackend = RolloutBackend.TRANSFORMERS
    """Generation engine: "transformers", or "vllm" (a separate install: `make install-vllm`)."""
    seed: int = 0
    """Sampling seed."""
    refresh_every: int = 0
    """A curriculum: every this many RL steps, the policy being trained re-measures the pass rate of every
    sampled train prompt (`samples_per_prompt` answers each, RL's sampling settings, through the run's own
    rollout and reward workers) and RL draws from the prompts now inside the band, so prompts the policy has
    learned to always solve leave and ones it starts to solve join. The selection then also stores every sampled
    prompt (`pool.jsonl`); each step logs the kept fraction (`pass_rate/kept_fraction`, drawn on the RL page). 0:
    the start model's selection holds for the whole run. Not with rl.max_staleness > 0."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    task: str = "addition"
    """Built-in task ("addition", "chain", "calculator": multiplication with a calculator tool, "calculator_lazy":
    the same with a teacher who skips the tool on any problem, or
    "guess_number": a guessing game over several turns - the last two for agent_pipeline), or "" to load
    `files`."""
    files: list[str] = field(default_factory=list)
    """Local data files (jsonl, parquet, csv) or one `save_to_disk` folder; used when `task` is ""."""
    eval_files: list[str] = field(default_factory=list)
    """Optional held-out files (same schema and fields as `files`), used as the eval split exactly as given:
    no re-split, no de-duplication. Rows that also occur in the train files are counted and reported. With
    eval files, `eval_size` must be 0."""
    format: DataFormat = DataFormat.AUTO
    """File format; AUTO picks it from each file's extension (a folder means SAVED)."""
    schema: DataSchema = DataSchema.PROMPT_COMPLETION
    """How rows map to examples: chat messages, prompt+completion, prompt+reference answer, or preference pairs
    (prompt, chosen, rejected). With a built-in task only "preference" changes anything: "addition" then comes as
    pairs (the correct sum chosen over a wrong one)."""
    messages_field: str = "messages"
    """Column holding the chat turns (schema MESSAGES)."""
    prompt_field: str = "prompt"
    """Column holding the prompt text (schemas PROMPT_COMPLETION and PROMPT_ANSWER)."""
    completion_field: str = "completion"
    """Column holding the target completion (schema PROMPT_COMPLETION)."""
    chosen_field: str = "chosen"
    """Column holding the preferred completion (schema PREFERENCE): text, or a list of {role, content} turns
    (TRL's conversational format; without a `prompt_field` column the turns both completions share are the
    prompt)."""
    rejected_field: str = "rejected"
    """Column holding the dispreferred completion (schema PREFERENCE), in the same form as `chosen_field`."""
    answer_field: str = "answer"
    """Column holding the reference answer (schema PROMPT_ANSWER; optionally PROMPT_COMPLETION - SFT pairs that
    RL then scores against the answer, e.g. a task's train rows - and PREFERENCE); "" means the rows
    have no reference answer (prompts for RL or eval with a user reward function that does not need one). A column
    of another name is also kept under that name, so a reward function may name it either way
    (`def f(completion, solution)` with answer_field "solution")."""
    system_prompt: str = ""
    """If set, a system turn with this text is put first in every example that does not start with one."""
    answer_marker: str = ""
    """If set (GSM8K: "####"), the reference answer is the text after the last marker in the answer or
    completion field."""
    num_examples: int = 20000
    """Synthetic tasks: number of problems generated (before de-duplication and the split)."""
    num_digits: int = 3
    """addition: digits per operand (zero-padded; the answer has num_digits + 1 digits); calculator: digits per
    factor."""
    chain_steps: int = 3
    """chain: number of dependent operations, each shown with its intermediate result."""
    demo_error_rate: float = 0.0
    """addition: the share of SFT demonstrations written by a "sloppy teacher" who drops the carry out of the top
    digit (e.g. 67+58= -> 025 instead of 125); calculator: the share of problems whose first factor starts with
    5-9 that the teacher answers in its head with a wrong estimate instead of calling the tool; guess_number: the
    share of games the sloppy guesser plays by stepping one at a time instead of halving the range. Only the
    demonstration is wrong: the reference answer that the verifier checks stays correct, so RL with the
    verifier can correct what SFT imitated."""
    eval_size: int = 500
    """Number of held-out examples in the eval split (taken after de-duplication); 0 with `eval_files`;
    guess_number: the number of eval games, the range's secrets in turn."""
    max_prompt_chars: int = 4096
    """Rows whose prompt is longer than this many characters are rejected with an error."""
    dedupe: bool = True
    """Drop exact duplicate examples (same prompt and target) before splitting."""
    seed: int = 0
    """Seed for synthetic generation and the train/eval split."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Tokenizer trained on the data for from-scratch models."""
    pass_rate: PassRateConfig = field(default_factory=PassRateConfig)
    """Before RL (`pipeline`), keep only the train prompts the start model sometimes solves
    (posttrain.eval.pass_rate); not read by data prep, whose cache it does not key."""



@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """LoRA adapters (peft): each targeted linear layer W gets W + B @ A * alpha / rank with A (rank x in) and
    B (out x rank, starting at zero) trained and W frozen (posttrain.models.lora)."""

    rank: int = 16
    """Rank r of each adapter."""
    alpha: float = 32.0
    """Scale numerator: the update B @ A is multiplied by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training (0: none, and the update is deterministic)."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                               "up_proj", "down_proj"])
    """Names (last component) of the linear layers that get adapters; each must exist in the model. The default
    covers attention and MLP of Llama-style models (SmolLM2, the tiny default)."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    base_path: str = ""
    """A local HF model folder (safetensors) to start from; "" builds a tiny model from scratch (or uses
    `artifact`)."""
    artifact: str = ""
    """A `model` artifact id (or unique prefix) in the store to start from instead of `base_path`, or
    `channel:NAME`: the model that channel holds when the run starts (e.g. a nightly retrain that continues
    from production's model)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute) in SFT and RL updates."""
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
    """Weights and compute dtype: BF16 loads the weights in bf16 on GPU; on CPU everything stays fp32."""
    init_seed: int = 0
    """Seed for from-scratch weight initialisation."""
    lora: LoraConfig | None = None
    """LoRA adapters for every stage that trains a model it starts from (SFT from model.base_path or
    model.artifact, DPO, reward models, distillation, the RL policy): only adapter weights train, the stored model
    is an adapter artifact whose parent is its base (`posttrain export ID DIR` writes it merged). None: every
    weight trains. SFT of a from-scratch model always trains every weight (its random base has nothing to adapt)."""


@dataclass(frozen=True, kw_only=True)
class TrackingConfig:
    wandb: bool = True
    """Log each stage (sft, rl, eval) as a wandb run grouped by the pipeline run id; false starts none."""
    wandb_mode: str = "offline"
    """"offline" (default: runs are written under `<store root>/wandb/<run id>/`; upload with `wandb sync`) or
    "online" (needs a wandb login)."""
    wandb_project: str = "posttrain"
    """wandb project name."""
    log_every: int = 0
    """Also print a console line every this many steps (0: paced by time alone; a progress bar shows every
    step when interactive)."""
    progress_every_s: float = 30.0  # = posttrain.tracking.progress.PROGRESS_EVERY_S
    """Without a terminal, SFT, RL and eval print a progress line (step, rate, ETA, key metrics) at least this
    often while they make progress - and, unless log_every asks for more, no more often."""


@dataclass(frozen=True, kw_only=True)
class SFTConfig:
    enabled: bool = True
    """Run SFT. false: the pipeline starts RL (and evaluation) from `model.base_path` or `model.artifact`."""
    steps: int = 300
    """Optimizer steps. 0 when `tokens` sets the budget instead."""
    tokens: int = 0
    """A budget in tokens instead of steps (`steps` must then be 0): the stage measures the train split's
    conversations with the model's tokenizer and chat template before it trains and runs
    ceil(tokens / (global_batch_size x their mean length)) steps, printed and stored in the model's config. Rows
    of different lengths then cost about the same time for the same budget (packed rows hold tokens, not
    examples). 0: use `steps`."""
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
    keep_state: bool = False
    """Keep the resumable training state after the final model is stored (default: deleted then)."""
    seed: int = 0
    """Seed for data order and dropout-free training randomness."""


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    num_problems: int = 500
    """Held-out problems scored (at most the eval split; 0 means the whole split)."""
    k: int = 0
    """Samples per problem for sampled accuracy and pass@k; 0 means greedy accuracy only."""
    temperature: float = 1.0
    """Sampling temperature for the k samples (greedy accuracy is reported separately)."""
    top_p: float = 1.0
    """Nucleus sampling for the k samples: keep the smallest set of tokens with this much probability."""
    top_k: int = 0
    """Keep only the k most likely tokens when sampling (0: no limit)."""
    max_new_tokens: int = 16
    """Generation limit per answer."""
    batch_size: int = 256
    """Prompts per generation batch (transformers backend; vLLM schedules its own batches)."""
    seed: int = 0
    """Sampling seed."""
    backend: RolloutBackend = RolloutBackend.TRANSFORMERS
    """Generation engine: "transformers", or "vllm" (a separate install: `make install-vllm`)."""
    environment: str = ""
    """Evaluate in a multi-turn environment (`module:Class`, as rl.environment): each problem is an episode
    (greedy, and k sampled ones) and its last sampled turn is what the verifier or reward.fn scores. Empty:
    one completion per problem, no environment."""
    tools: list[str] = field(default_factory=list)
    """Tool functions (`module:function`, as rl.tools) the model may call in its episodes."""
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    """The episodes' limits and python_path (as rl.episode); eval.max_new_tokens is each turn's limit."""


