"""Recipes for a small pretrained instruct model (SmolLM2-135M-Instruct from `make real-model`, or YOUR folder) on a
2-core CPU: RL straight from the folder, SFT on a task's rows then RL, and the Calculator agent. Registered in
posttrain.recipes.RECIPES beside the tiny recipes (posttrain/recipes/__init__.py)."""

from __future__ import annotations

from dataclasses import replace

from posttrain.config import (
    DataConfig,
    EpisodeConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    PassRateConfig,
    PipelineConfig,
    PlacementConfig,
    RLConfig,
    SFTConfig,
    TokenizerConfig,
)
from posttrain.envs.tasks import CALCULATOR
from posttrain.models.smollm2 import default_dir as smollm2_default_dir


def small_instruct_cpu() -> PipelineConfig:
    """A small pretrained instruct model (about 100-500M parameters) post-trained on a 2-core CPU.

    model.base_path - YOUR model: set it to a local HF folder with safetensors weights and its own tokenizer
    and chat template (`{"model": {"base_path": "/path/to/folder"}}`), or give `model.artifact` instead (then
    override base_path to ""). It defaults to the SmolLM2-135M-Instruct folder that `make real-model` builds
    ($POSTTRAIN_MODELS or ~/.cache/posttrain/models), so the recipe resolves and runs as is; nothing reads the
    folder before a stage starts. data - the built-in 3-digit addition task as a stand-in (2,000 rows, 100
    held out) so the recipe runs end to end; for your own data set `data.task` "" and `data.files` (and
    `data.eval_files`, `reward.fn`). data.tokenizer.train is false: a pretrained model brings its tokenizer.

    Why these numbers, against tiny_cpu (a 0.56M model trained from random weights):
    - model.max_seq_len 256 (tiny: 32): the model's chat template alone adds ~30 tokens (SmolLM2's default
      system line), real prompts are sentences, and answers come in words; 256 leaves ~190 prompt tokens
      beside 64 new ones. Longer costs attention time and memory on every step.
    - sft.lr 1e-5 with 10% linear warm-up and cosine decay to 1e-6 (tiny: 3e-3): from random weights a large
      step is needed; a pretrained model already has language and the chat format, and AdamW moves every
      weight by about lr per step, so large rates overwrite what it knows (full fine-tuning of models this
      size commonly uses 1e-5 to 5e-5). Warm-up lets Adam's moment estimates settle before full-size steps.
    - sft batches: global 16, micro 4 per rank on 2 ranks (2 accumulation steps), 60 steps = 960 examples
      (tiny: 128 x 2,000). A 135M model costs ~240x the compute per token of the tiny one; a pretrained
      model needs a few hundred demonstrations to pick up a format, not many thousands to learn a language.
    - rl.lr 1e-6 with 3 warm-up steps (tiny: 5e-5): the policy already writes fluent text; GRPO only shifts
      probability between its own samples, and at larger rates a few noisy steps of 32 samples can undo what
      pre-training and SFT built. Constant after warm-up, as for every RL run here.
    - rl.prompts_per_step 8 x samples_per_prompt 4 = 32 completions per step, max_new_tokens 64 (tiny:
      128 x 8 x 8 tokens): generation dominates an RL step on CPU (tens of tokens/s for this model), so the
      batch is what 2 cores turn around in a few minutes; 4 samples still give GRPO a group to compare.
      rl.micro_batch_size 4: the 49k-token vocabulary makes logits of 4 x 256 tokens ~200 MB in fp32.
    - model.gradient_checkpointing true: measured with bench/rl_memory.py (2 policy ranks, 3 RL steps), the
      policy ranks' peak PSS drops from 6.99 to 5.73 GiB for ~10% more update time; memory, not compute,
      is what a 2-core 24 GB machine runs out of first.
    - placement: ONE policy rank and one rollout worker, each with torch_threads 2 (colocated roles take turns
      by phase, so each has both cores while it computes). Two policy ranks on 2 cores split the same compute
      but each holds the whole weights and gradients: bench/rl_memory.py, 3 steps, peak summed PSS
      8.61 GiB with 2 ranks x 1 thread (3 steps), 5.27 GiB with 1 rank x 2 threads (20 steps). Give a larger machine more
      ranks (placement.policy_workers) and set torch_threads to cores / ranks.
    - rl.kl_coef 0 (off): a reference model is another ~1 GB process and one more forward per step, and
      20 steps at 1e-6 stay close to the start. Set it to ~0.02 for long runs or rewards that can be gamed.
    - eval.k 0: greedy accuracy only on 50 problems with 64 new tokens (a sampled pass multiplies the
      generation time); ask for `eval.k` 4 when you want sampled accuracy and pass@k.
    - rl.remote_timeout_s 1800: one rollout or update call of a 135M model on a busy 2-core CPU can take
      minutes; the timeout only bounds a hung worker, so it is generous.
    """
    return PipelineConfig(
        name="small_instruct_cpu",
        data=DataConfig(task="addition", num_examples=2000, num_digits=3, eval_size=100, seed=0,
                        tokenizer=TokenizerConfig(train=False)),
        model=ModelConfig(base_path=str(smollm2_default_dir()), max_seq_len=256, gradient_checkpointing=True),
        sft=SFTConfig(steps=60, global_batch_size=16, micro_batch_size=4, lr=1e-5, min_lr_ratio=0.1,
                      warmup_steps=6, nproc=2, save_every=20),
        eval=EvalConfig(num_problems=50, k=0, max_new_tokens=64, batch_size=64),
        rl=RLConfig(steps=20, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=64, lr=1e-6,
                    warmup_steps=3, micro_batch_size=4, kl_coef=0.0, checkpoint_every=10, remote_timeout_s=1800.0),
        placement=PlacementConfig(policy_workers=1, rollout_workers=1, torch_threads=2),
    )


def small_instruct_lora_cpu() -> PipelineConfig:
    """small_instruct_cpu for RL with LoRA adapters straight from a pretrained instruct model (no SFT), the policy
    rank generating its own rollouts.

    - model.lora rank 16, alpha 32 on the 7 attention and MLP projections: 4.9M trained parameters beside the
      135M of SmolLM2; the base stays frozen.
    - placement.rollout_workers 0: the policy rank generates with its own model (adapters applied), so no
      rollout worker holds a second copy and no weights are handed over after each update.
    - rl.lr 3e-4 without warm-up (small_instruct_cpu's full fine-tuning: 1e-6): adapters start at zero (B = 0),
      so their updates must be large for B @ A to move; peft and TRL examples use 1e-4 to 5e-4.
    - rl.samples_per_prompt 8 (8 prompts x 8 = 64 completions a step): on a hard task most groups of 4 were all
      wrong, which gives GRPO no signal; rl.max_new_tokens 24 and eval.max_new_tokens 24 for short answers.
    - eval.k 0: greedy only (k 4 made the evaluation of 256 problems take 5 min instead of 40 s).
    - rl.policy_generate_batch 32: the policy rank generates its 64 rows in two batches, so their KV cache
      needs ~0.16 GiB instead of ~0.44 at a ~7% longer rollout (bench/policy_phases.py); with it two runs
      peaked at 2.88 and 3.07 GiB summed PSS against 5.13 and 5.25 for full fine-tuning, steps x0.94 and x0.82
      (bench/rl_lora.py). Since the policy trims its heap after every micro-batch and every role worker runs
      with placement.malloc_arena_max 2: 2.81 / 2.67 / 2.66 GiB against 5.07 / 5.16 / 5.20, steps x0.84 /
      x0.83 / x0.93 (bench/results/lora-in-policy-trim-2026-11-26.txt).

    Measured with bench/real_model.py (reasoning-gym chain_sum, one-digit terms, seed 0): these settings, 30
    steps, took 26.4 min in all and moved held-out greedy accuracy 0.129 -> 0.137. With rl.temperature 0.7,
    rl.kl_coef 0.05 (the reference is the base with the adapters off, no second model), rl.steps 60,
    model.gradient_checkpointing false and the train questions from chain_sum's 2-term config, held-out greedy
    went 0.227 -> 0.367 (+0.141) for seeds 0 and 1 in 50.4 and 46.2 min (README, "A real model made better")."""
    base = small_instruct_cpu()
    return replace(base, name="small_instruct_lora_cpu", model=replace(base.model, lora=LoraConfig()),
                   sft=replace(base.sft, enabled=False),
                   eval=replace(base.eval, k=0, max_new_tokens=24),
                   rl=replace(base.rl, lr=3e-4, warmup_steps=0, max_new_tokens=24, steps=30, samples_per_prompt=8,
                              policy_generate_batch=32),
                   placement=replace(base.placement, rollout_workers=0))


def small_instruct_sft_rl_cpu() -> PipelineConfig:
    """A small pretrained instruct model taught YOUR task on a 2-core CPU: LoRA SFT on the task's train rows (each
    row's answer as the reply), prompt selection by the SFT model's pass rate, then GRPO on the kept prompts.

    For data whose rows hold a question and its answer (`data.schema` "prompt_completion" with the answer as the
    completion and in `data.answer_field`, or your own demonstrations) and a reward that checks answers. RL alone
    from the folder (small_instruct_lora_cpu) needs a task the model already solves sometimes: on SmolLM2-135M-
    Instruct, of seven reasoning-gym families probed only chain_sum gave GRPO groups with a right answer
    (bench/results/real-model-tasks-2026-11-30.txt), and there RL moved 2-term sums only. SFT on the train rows'
    answers first gives RL a model that answers in the task's form and is right often enough for its groups.

    - sft: LoRA (rank 16, as small_instruct_lora_cpu) on a budget of 225,000 tokens (`sft.tokens`: the steps are
      worked out from the train rows' measured length, so a family of long rows gets fewer steps, not more time),
      16 rows a step at lr 6e-4 with 4 warm-up steps and cosine decay to 6e-5, on 2 ranks x micro-batch 4;
      checkpointed once, at the end. chain_sum's ~52-token rows give 268 steps, number_sorting's ~220-token rows 64;
      each took ~17 min here. Chosen on the validation split over both families (bench/results/real-model-sft-
      probe-2026-11-30.txt, runs 5-8), greedy after SFT from the folder's 0.199 / 0.000:
      lr 2e-4 -> chain_sum 0.688, number_sorting 0.352; lr 6e-4 -> 0.742, 0.617. A budget in steps could not
      serve both within the hour: 160 steps gave chain_sum 0.504 in ~12 min but took number_sorting 50 min.
    - data.pass_rate: 8 samples for each of the first 256 train prompts, at RL's temperature; RL keeps those the
      SFT model solves sometimes but not always (256, not 384: number_sorting's selection would otherwise take
      ~10 of the hour's minutes).
    - rl: GRPO on new adapters over the SFT model, 8 prompts x 8 samples, lr 5e-5, temperature 0.7, KL 0.05 to the
      SFT model (adapters off), 30 steps (~42-52 s a step for number_sorting here, far less for chain_sum); 48 new tokens (a list of four numbers
      is ~25). lr 5e-5, not small_instruct_lora_cpu's 3e-4: over the SFT model 3e-4 took chain_sum's validation
      greedy 0.504 -> 0.422 (KL 0.95 at step 2); 5e-5 gave 0.504 -> 0.520, RL's own part +0.016 (-0.027, +0.058)
      paired, and the folder -> RL change +0.320 (+0.253, +0.383) (seed 0; bench/results/real-model-sft-rl-
      validation-2026-11-30.txt; that SFT was 160 steps at 2e-4). Over this SFT, RL's own part on validation:
      number_sorting +0.051 (+0.019, +0.083), chain_sum +0.023 (-0.012, +0.059) (bench/results/real-model-recipe-
      validation-2026-11-30.txt). Swept over SFT on the validation split of both families, one at a time around these
      (chain_sum: lr 1e-4 / 2e-5, temperature 1.0, KL 0; number_sorting: lr 1e-4, KL 0, temperature 1.0;
      bench/results/real-model-rl-sweep-arith-2026-12-01.txt and -sort-):
      none differed from these by an interval excluding 0 at step 10, 20 or 30. KL 0 matched them in 21% less time
      on both; 0.05 stays, as the test-split tables were measured with it (docs/lora.md). rl.micro_batch_size 8:
      the policy scores a prompt's 8 samples in one micro-batch,
      so prompt sharing (rl.share_prompt) puts the prompt through the model once per update instead of twice; the
      loss is normalised over the global batch, so the math is the same.
    - model.gradient_checkpointing false: LoRA's activations are small beside the frozen weights here, and it is
      ~15% faster a step.
    - eval: greedy, 48 new tokens."""
    base = small_instruct_lora_cpu()
    return replace(
        base, name="small_instruct_sft_rl_cpu",
        data=replace(base.data, pass_rate=PassRateConfig(enabled=True, samples_per_prompt=8, max_prompts=256)),
        model=replace(base.model, gradient_checkpointing=False),
        sft=replace(base.sft, enabled=True, steps=0, tokens=225_000, lr=6e-4, warmup_steps=4, save_every=0),
        eval=replace(base.eval, max_new_tokens=48),
        rl=replace(base.rl, steps=30, lr=5e-5, temperature=0.7, kl_coef=0.05, max_new_tokens=48, micro_batch_size=8))


def small_instruct_calculator_cpu() -> PipelineConfig:
    """agent_pipeline on a real model: SmolLM2-135M-Instruct (`make real-model`) with LoRA learns when to call
    the Calculator environment's `calculate` tool on 3-digit x 3-digit products, which it cannot do in its head.

    The task is `calculator_lazy` (posttrain.envs.tasks): tiny_calculator's problems and tool, but the teacher
    skips the tool on 60% of ALL problems (`data.demo_error_rate` 0.6) and answers with a wrong mental estimate,
    so SFT teaches the tool format and a policy that often skips the tool, and RL in the environment has that
    decision to correct. Measured (seed 1, docs/agents.md): sampled at T=1 the SFT model called the tool in 23% of
    the episodes, but greedy on 174 of 200 problems (0.860) - the estimates' first tokens spread over several
    digits, so the call's one opening token wins unless one digit dominates; RL took it to 0.995. With
    tiny_calculator's rule (skips only when the first factor
    starts with 5-9) SmolLM2 did not pick the rule up from 400 demonstrations: after SFT it called the tool on
    all 200 held-out problems of seed 0 (greedy 1.000), leaving RL nothing to add. SmolLM2's
    chat template has no tool turns: episodes use the documented format (posttrain.envs.calls) - tools in the
    system turn, `<tool_call>` in the assistant's text, results as user turns between `<tool_response>` tags.

    - data: 600 problems, 200 held out (the issue asks for >= 200 held-out problems), 400 demonstrations.
    - model.lora (rank 16 on the 7 projections) for SFT and RL; SFT trains adapters on the folder, RL trains new
      ones on the SFT model. max_seq_len 320: the tools block makes a prompt 186 tokens, a whole
      demonstration 255.
    - sft: 40 steps of 16 (1.6 epochs of the 400) at lr 2e-4 (adapters start at zero; small_instruct_lora_cpu's
      RL lr is 3e-4), on small_instruct_cpu's 2 ranks x micro-batch 4.
    - rl: GRPO, 10 steps of 8 prompts x 8 samples, lr 3e-4 as small_instruct_lora_cpu, the policy rank
      generating its own episodes (placement.rollout_workers 0); a call is ~33 tokens, so rl.max_new_tokens 40
      a turn; at most 3 turns, 96 response tokens. 10 steps, from the TRAINING curve of a 20-step run of seed 1
      (stopped at step 5, ~2.3 min a step here): sampled training accuracy 0.22, 0.66, 0.83, 0.84, 0.95 - so the
      whole pipeline fits the hour the issue allows on this CPU.
    - eval: greedy only (`eval.k` 0) on the 200 held-out problems."""
    base = small_instruct_lora_cpu()
    episode = EpisodeConfig(max_turns=3, max_env_tokens=24, max_total_tokens=96)
    return replace(
        base, name="small_instruct_calculator_cpu",
        data=replace(base.data, task="calculator_lazy", num_examples=600, num_digits=3, eval_size=200,
                     demo_error_rate=0.6),
        model=replace(base.model, max_seq_len=320, gradient_checkpointing=False),
        sft=replace(base.sft, enabled=True, steps=40, lr=2e-4, warmup_steps=4, save_every=20),
        eval=replace(base.eval, num_problems=200, k=0, max_new_tokens=40, environment=CALCULATOR, episode=episode),
        rl=replace(base.rl, steps=10, max_new_tokens=40, environment=CALCULATOR, episode=episode))
