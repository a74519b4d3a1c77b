"""The RL stage's config sections: `reward` (what scores a sample), `rl` (the algorithm and its settings) and
`placement` (where the role actors run). Re-exported by posttrain.config.sections and posttrain.config.

Every field is documented by the string literal under it; `posttrain.config.checks.validate` holds the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from posttrain.config.algorithms import Algorithm
from posttrain.config.enums import (
    KLEstimator,
    LossAgg,
    MismatchCorrection,
    Parallelism,
    PlacementMode,
    RolloutBackend,
)


@dataclass(frozen=True, kw_only=True)
class RewardConfig:
    fn: str = ""
    """User reward function "module:function" (imported, never eval'ed); "" uses the task's built-in verifier.
    It is called with the arguments it names, taken from `prompt` (the last user text), `messages` (the
    prompt turns), `completion`, `answer` and every column of the row by its own name (`**kwargs` gets them
    all); a function whose first two parameters are `prompts, completions` is called once per batch with
    lists (as TRL's reward functions are). It must return a finite number (a list of them for a batch)."""
    python_path: list[str] = field(default_factory=list)
    """Folders put first on the reward process's sys.path: where the function's module and its own
    dependencies live (e.g. a `pip install --target DIR` folder). Must exist where RL and eval run."""
    timeout_s: float = 5.0
    """Per-call time limit (per batch for a batch function); the function runs in a separate process that
    is killed and replaced when it overruns."""
    memory_mb: int = 2048
    """Memory the function may take on top of what importing it took (the reward process's address-space
    limit, RLIMIT_AS, is set to its size after the import plus this); over it, the call fails with the reason
    and the process is replaced. 0: no limit. Applies only with `fn` set (built-in verifiers run in-process)
    and on Linux."""
    cpu_s: float = 10.0
    """CPU seconds one call may use, all threads of the reward process together (RLIMIT_CPU, raised before
    each call); over it the process is killed and replaced and the call fails with the reason. 0: no limit.
    Differs from `timeout_s` (wall time) for a function that runs several threads."""
    models: list[str] = field(default_factory=list)
    """Learned reward models that score every RL sample (the reward-model role): `reward_model` or `model`
    artifact ids, `channel:NAME`, or local folders holding a sequence classifier with one output (stored in
    the artifact store by content, so the RL model's lineage names them). Each scores the prompt plus the
    completion rendered with its own tokenizer's chat template."""
    model_weights: list[float] = field(default_factory=list)
    """Weight of each of `models` in the reward (empty: 1.0 each)."""
    fn_weight: float = 1.0
    """Weight of the reward function's (or the task's verifier's) score in the reward: reward = fn_weight x
    function score + sum of model_weights[i] x model i's score. 0 with `models` set: the models are the only
    reward, and the function's score is still computed and logged (reward/fn_mean, reward/fn_accuracy) to
    watch what the models reward."""

    def function_only(self) -> RewardConfig:
        """These settings without the reward models and their mix: what evaluation and pair scoring use (they
        score with the function or verifier alone), so their caches do not depend on RL's reward mix."""
        return replace(self, models=[], model_weights=[], fn_weight=1.0)


@dataclass(frozen=True, kw_only=True)
class EpisodeConfig:
    """Multi-turn episodes (rl.environment / rl.tools, or eval.environment / eval.tools; posttrain.envs): their
    limits and where the user's code is imported from. The environment and its tools run in a process of their
    own (per RL worker), never in a worker or the evaluation's process."""

    python_path: list[str] = field(default_factory=list)
    """Folders put first on the tool process's sys.path: where the environment's or tools' modules live. Must
    exist where the episodes run."""
    max_turns: int = 4
    """Turns the policy samples per episode, each at most rl.max_new_tokens (eval.max_new_tokens); the
    environment answers after each but the last (which is the episode's answer whatever it says)."""
    max_env_tokens: int = 64
    """Tokens of one environment answer (a tool's result, an observation); a longer one is cut to this, with a
    visible marker the model reads."""
    max_total_tokens: int = 256
    """Response tokens of one episode, sampled and the environment's together; an episode that reaches it ends,
    unfinished. Prompt + this must fit model.max_seq_len."""
    tool_timeout_s: float = 10.0
    """Wall seconds per tool call, reset or step: over it the call fails (the model reads why), the tool process
    is replaced and its open episodes replayed into the new one."""
    tool_cpu_s: float = 0.0
    """CPU seconds per call (0: no limit); differs from tool_timeout_s for a tool that runs several threads."""
    tool_memory_mb: int = 0
    """Memory a call may add to what importing the environment took (0: no limit); over it the call fails as
    out_of_memory and the process is replaced. Linux only."""
    max_result_chars: int = 65536
    """A tool result or observation longer than this is cut in the tool process, before it travels."""


@dataclass(frozen=True, kw_only=True)
class RLConfig:
    enabled: bool = True
    """Run the RL stage after SFT."""
    algorithm: Algorithm = Algorithm.GRPO
    """The loop each step runs (posttrain.rl.loops): 'grpo' (group-relative advantages, no critic); 'ppo' (a
    critic role's values, GAE over token rewards, clipped value loss); 'rloo' (leave-one-out group baseline);
    'dr_grpo' (group-centred, never std-scaled, token sums over a constant normaliser); 'gspo' (GRPO's
    advantages, a clipped sequence-level ratio, whose deviations from 1 are ~1e-3: rl.clip_low / rl.clip_high
    default to the paper's 3e-4 / 4e-4 under it); 'reinforce_pp' (token returns with the KL in the reward,
    whitened over the batch); 'dapo' (GRPO's advantages on groups whose rewards differ - dynamic sampling draws
    more prompts to fill the batch -, the soft overlong punishment, clip-higher through rl.clip_high, token-mean
    loss); 'on_policy_distill' (the student samples, rl.teacher scores every token: advantage = teacher log p -
    student log p). An algorithm's published defaults (posttrain.config.algorithm_defaults.DEFAULTS) replace
    RLConfig's for the settings neither the recipe nor the overrides set; the plan prints those it took."""
    steps: int = 60
    """Policy updates (one rollout batch each)."""
    prompts_per_step: int = 64
    """Prompts sampled per step."""
    samples_per_prompt: int = 8
    """Completions per prompt (the GRPO group size)."""
    temperature: float = 1.0
    """Rollout sampling temperature."""
    top_p: float = 1.0
    """Rollout nucleus sampling (1.0: off). Log-probs are those of the truncated distribution sampled from."""
    top_k: int = 0
    """Rollout top-k sampling (0: off)."""
    max_new_tokens: int = 16
    """Rollout generation limit."""
    lr: float = 3e-5
    """Policy learning rate (AdamW, constant after warm-up). Fresh Adam moves every weight by ~lr per step,
    so RL on a tiny model needs a small one: 5e-4 collapsed the tiny_cpu model within 10 steps (measured)."""
    warmup_steps: int = 0
    """Linear warm-up steps for the policy learning rate."""
    inner_epochs: int = 1
    """Passes over each rollout batch (clipped importance ratio after the first optimizer step)."""
    mini_batches: int = 1
    """Optimizer steps per pass: the batch's sequences are split into this many mini-batches (a seeded
    permutation per version), each one step (PPO's mini-batches; the policy and, in PPO, the critic)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward on one policy rank."""
    share_prompt: bool = True
    """Score the samples of a prompt with the prompt once (posttrain.models.prompt_sharing): in the policy's
    update, its old log-probs and the reference's, the rows of a micro-batch that repeat a prompt become one row,
    the prompt and then each response under a 4D mask - the same log-probs, float rounding aside, for one pass
    of the prompt through the model instead of one per sample. False: a padded row per sample, as TRL does.
    (Generation always runs a prompt's prefill once, whatever this says.)"""
    policy_generate_batch: int = 0
    """With placement.rollout_workers 0: rows (prompt x sample) a policy rank generates at once; their KV cache
    lives in the rank that also holds the update (SmolLM2-135M, 64 rows x ~100 tokens: ~0.45 GiB at once,
    ~0.23 GiB in batches of 32). 0: all of the rank's rows at once."""
    clip_low: float = 0.2
    """Lower clip range: ratio >= 1 - clip_low (gspo's default: 3e-4, see rl.algorithm)."""
    clip_high: float = 0.28
    """Upper clip range: ratio <= 1 + clip_high (DAPO's clip-higher; gspo's default: 4e-4, see rl.algorithm)."""
    clip_ratio_c: float = 0.0
    """Dual-clip bound (Ye et al. 2019; verl's clip_ratio_c, 3.0 there): where the advantage is negative the
    token's loss is at most -advantage * clip_ratio_c. 0: off; otherwise > 1."""
    kl_coef: float = 0.0
    """KL penalty to the reference model; 0 means no reference role is created."""
    kl_estimator: KLEstimator = KLEstimator.K3
    """KL estimator used for the penalty."""
    kl_in_reward: bool = False
    """PPO: subtract kl_coef * KL(rollout || reference) (k1, per token) from the token rewards instead of
    adding the KL term to the policy loss."""
    gamma: float = 1.0
    """PPO: discount of GAE; REINFORCE++: discount of the token returns."""
    lam: float = 1.0
    """PPO: lambda of GAE (1.0: Monte-Carlo returns minus the value baseline)."""
    critic_lr: float = 1e-5
    """PPO: the critic's learning rate (AdamW, constant)."""
    critic_warmup_steps: int = 0
    """PPO: the first this many steps train only the critic (the policy keeps its weights and version)."""
    critic_init: str = ""
    """PPO: where the critic starts: "" = the policy's start model with a fresh value head (seeded by
    rl.seed), or a reward model - an artifact id (or unique prefix), `channel:NAME` or a local folder holding a
    sequence-classification model with one output -, named in the RL model's lineage."""
    value_clip: float = 0.5
    """PPO: the clipped value loss's range around the rollout's values (verl's cliprange_value)."""
    teacher: str = ""
    """on_policy_distill: the teacher - an artifact id (or unique prefix), `channel:NAME` or a local HF folder -
    with the student's tokenizer; named in the distilled model's lineage."""
    distill_reward_weight: float = 0.0
    """on_policy_distill: weight of the task reward's group advantage (GRPO's) added to every token's
    reverse-KL advantage (0: pure distillation; the task reward is still scored and logged)."""
    max_extra_draws: int = 4
    """DAPO: extra prompt batches one step may draw to replace the groups whose rewards are all equal (they
    teach nothing and are dropped). When the bound is reached, the step trains on the groups it has, prints a
    warning and logs dapo/short_batch 1."""
    overlong_buffer: int = 0
    """DAPO: soft overlong punishment over the last this many tokens before rl.max_new_tokens: a response of
    max_new_tokens - overlong_buffer + k tokens loses k / overlong_buffer x rl.overlong_penalty (0: off)."""
    overlong_penalty: float = 1.0
    """DAPO: what a response of rl.max_new_tokens tokens loses with the overlong buffer on."""
    loss_agg: LossAgg = LossAgg.TOKEN_MEAN
    """How token losses aggregate over the global batch (dr_grpo and gspo fix their own)."""
    std_normalize: bool = True
    """GRPO, GSPO, DAPO: divide group-centred rewards by the group's std (dr_grpo never does)."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold; 0 disables."""
    parallelism: Parallelism = Parallelism.DDP
    """How the policy (and PPO's critic) ranks hold the model - `sft.parallelism`'s values, on the same training
    core (posttrain.spmd): DDP (every rank the whole model, its gradients and moments) or FSDP2 (each rank 1/N
    of the weights, gradients and moments, a layer gathered at a time). Within 1e-5 of each other."""
    max_reward_failure_rate: float = 0.1
    """Stop the run when more than this share of one step's reward calls fail (raise, time out, return a
    non-number or a non-finite one), naming the function, the count and one example."""
    max_staleness: int = 0
    """Rollout ahead of the update (posttrain.rl.ahead): with k > 0 the rollout workers generate the next steps'
    samples while the policy updates, and every sample is trained on at most k policy versions after the one
    that generated it - exactly k in a steady GRPO run: draw d is generated with the weights current when draw
    d - k was taken, so the lag depends on the order of draws, never on timing, and a run (and its resume) is
    reproducible. 0: the synchronous loop, generation waiting for each update. Stale samples are corrected by
    rl.mismatch_correction: 'off' clips the ratio against the rollout's own (behaviour) log-probs; 'token_tis',
    'sequence_tis' or 'token_mask' is decoupled PPO - the ratio against the trainer's current (proximal)
    log-probs, each token weighted by the capped behaviour ratio. The drift gate compares every sample with the
    trainer at the version that generated it (each policy rank keeps the trained weights of its last k + 1 versions). Needs
    rollout workers of their own (placement.rollout_workers >= 1)."""
    checkpoint_every: int = 20
    """Save a model artifact and the training state every this many steps (0: only at the end)."""
    keep_state: bool = False
    """Keep the resumable training state after the final model is stored (default: deleted then)."""
    ahead_drift_fraction: float = 0.125
    """With rl.max_staleness > 0, the share of each policy rank's rows (evenly spaced, at least one) whose drift
    is measured at the version that generated them: that check is one extra no-grad forward per step with the
    kept weights of that version (the synchronous loop's is free), so it runs over 1/8 of the rows by default.
    1.0: every row. Only read when generating ahead."""
    new_weights_between_turns: bool = False
    """With rl.max_staleness > 0 and multi-turn episodes (rl.environment / rl.tools): a draw's episodes take the
    next policy version between their first and second turn, so their later turns carry one version of lag fewer
    (posttrain.rl.ahead). Which version an episode's turn is sampled by still follows the order of draws, never
    timing: a draw launched with version v samples its first turn with v and its later turns with v + 1 when v +
    1's weight load is the next rollout call queued after it (a GRPO step's; not when another draw was launched
    first, as DAPO's extra draws and the first k are), waiting at the first turn's end for that version to be
    published. So a run and its resume stay reproducible, and every token carries the version that sampled it
    (Trajectories.token_versions; the bound, the drift gate and async/staleness_mean read them). The price: with
    k = 1 the later turns wait for the update, so only the first turn overlaps it. False: an episode keeps the
    weights it started with."""
    drift_threshold: float = 0.05
    """Fail when mean |rollout logprob - policy logprob| over the same tokens exceeds this."""
    mismatch_correction: MismatchCorrection = MismatchCorrection.OFF
    """Correct for the rollout engine's log-probs differing from the trainer's (posttrain.rl.algorithms.mismatch):
    'off'; 'token_tis' / 'sequence_tis' (the trainer's own old log-probs at the rollout's version, each token /
    sequence weighted by the truncated importance ratio trainer / rollout); 'token_mask' (tokens whose ratio
    leaves [1 / rl.mismatch_cap, rl.mismatch_cap] are left out). The gap is logged every step either way
    (mismatch/kl, mismatch/max_abs_logp). rl.drift_threshold still stops a run whose gap is that large."""
    mismatch_cap: float = 2.0
    """The truncation cap C of the mismatch correction's importance ratio (verl's default threshold: 2)."""
    remote_timeout_s: float = 300.0
    """Timeout for every remote call to a role worker; the error names the stage and the worker."""
    step_timeout_s: float = 1800.0
    """The longest one RL step may take, end to end: the driver's watchdog fails (or restarts) the run when no
    step finishes within this, naming the step and the stage the controller is in; so a whole run is bounded
    by about steps x this, never days."""
    max_restarts: int = 2
    """Times one RL run rebuilds its actors after a worker is lost (killed, crashed, its node gone) or a
    call or step times out: every role actor and the controller are replaced and the run resumes from its
    last checkpoint (steps after it are re-done from the same state, so none is lost or repeated). 0: a lost
    worker ends the run."""
    rollout_backend: RolloutBackend = RolloutBackend.TRANSFORMERS
    """Generation engine for rollouts (vLLM needs a separate install)."""
    environment: str = ""
    """Multi-turn episodes in an environment: its class by import path, `module:Class` (imported in the tool
    process, never eval'ed). One instance per episode, built empty; `reset(**row)` gets the dataset row's fields
    and may return the first observation; its public, typed methods with Google-style docstrings are the tools
    the model calls (their JSON schemas come from the signatures, as transformers.utils.get_json_schema and
    TRL's environment_factory make them); an optional `step(text)` answers every turn instead (games,
    simulated users) and may give a per-turn reward or end the episode; an optional `get_reward()` is the
    episode's own reward. The model calls tools in the documented format of posttrain.envs.calls, rendered
    through its own chat template. Limits: rl.episode. "" (and no rl.tools): one completion per prompt."""
    tools: list[str] = field(default_factory=list)
    """Plain tool functions by import path (`module:function`, typed, with docstrings): the simple case of
    rl.environment - episodes whose only environment is these tools. Both may be set: the environment's tools
    and these."""
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    """Limits of multi-turn episodes and where their code is imported from; only with rl.environment or
    rl.tools."""
    seed: int = 0
    """Seed for prompt sampling and rollout sampling."""


@dataclass(frozen=True, kw_only=True)
class PlacementConfig:
    mode: PlacementMode = PlacementMode.COLOCATED
    """COLOCATED: roles share devices, taking turns by phase. SPLIT: each role on its own devices."""
    policy_workers: int = 2
    """Ranks in the SPMD policy group. Fixed in the Ray task's `train` worker group on a cluster."""
    rollout_workers: int = 1
    """Generation workers (the `rollout` worker group on a cluster). 0: no rollout workers - the policy ranks
    generate with their own model (adapters applied), as verl's hybrid engine does: no second copy of the
    weights, no weight transfer; each rank takes its share of the prompts. Transformers backend only."""
    reference_workers: int = 1
    """Reference log-prob workers (only created when rl.kl_coef > 0)."""
    teacher_workers: int = 1
    """Teacher log-prob workers (only created with rl.algorithm on_policy_distill)."""
    reward_workers: int = 1
    """Reward scoring workers."""
    environment_workers: int = 1
    """Workers of the environment role (created only with rl.environment or rl.tools): each runs one sandboxed
    tool process holding the instances of the episodes it was given."""
    critic_workers: int = 0
    """PPO: ranks of the SPMD critic group; 0: as many as policy_workers."""
    reward_model_workers: int = 1
    """Workers of the reward-model role (created only with reward.models set); each holds every model."""
    gpus_per_worker: float = 0.0
    """GPUs per role worker (0 on CPU). In COLOCATED mode roles share each device."""
    torch_threads: int = 1
    """torch intra-op threads in each policy rank (and in each rollout and reference worker unless
    `rollout_threads` says otherwise). In COLOCATED mode the controller runs one phase at a time, so only one
    role computes at once: with one worker per role on a node, that worker may use the node's cores (e.g. 2
    on a 2-core CPU). 1 when a role's workers share the cores (two policy ranks on 2 cores: one each). More
    threads also change float summation order, so figures measured with one setting move slightly with
    another."""
    rollout_threads: int = 0
    """torch intra-op threads in each rollout and reference worker; 0: the same as `torch_threads`. For
    COLOCATED placements whose policy group has several ranks per node but whose rollout phase runs one
    worker there (tiny_cpu: 2 policy ranks at 1 thread, the rollout at 2; phase times of 10 RL steps from the
    tiny_cpu SFT model: rollout 0.43 -> 0.35 s, step 0.97 -> 0.88 s). The transformers engine only: vLLM sets its own threads."""

    malloc_arena_max: int = 2
    """glibc malloc arenas in each role worker's process: `MALLOC_ARENA_MAX` in the environment Ray starts it
    with (merged with the job's). glibc's default (8 per core) gives threads that allocate their own arenas,
    which keep freed memory: RL with LoRA on SmolLM2-135M peaked at 2.88 / 3.07 / 3.05 GiB summed PSS in
    identical runs with it, 2.95 / 3.02 / 2.95 with 2 - and 2.81 / 2.67 / 2.66 once the policy also trimmed its
    heap after every micro-batch (bench/results/lora-in-policy-*-2026-11-26.txt). 0: glibc's default. No effect
    where the C library is not glibc (musl, macOS)."""

    def worker_env_vars(self) -> dict[str, str]:
        """Environment variables every role worker process starts with."""
        return {"MALLOC_ARENA_MAX": str(self.malloc_arena_max)} if self.malloc_arena_max else {}

    @property
    def generation_threads(self) -> int:
        """Threads of the rollout and reference workers: `rollout_threads`, else `torch_threads`."""
        return self.rollout_threads or self.torch_threads
