"""Recipes: functions that return a complete `PipelineConfig`.

A recipe is plain Python - variants copy and edit a base with `dataclasses.replace`. The registry is a
dict you can grep. `resolve(name, overrides)` is what the Flyte `plan` task and the tests call: it looks
the recipe up, merges JSON overrides of individual fields, gives the rl settings neither set the algorithm's
published defaults (posttrain.config.algorithm_defaults) and validates the result before any work runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from posttrain.config import (
    Algorithm,
    ConfigError,
    DataConfig,
    DistillConfig,
    DPOConfig,
    DType,
    EpisodeConfig,
    EvalConfig,
    ModelConfig,
    PairsConfig,
    PipelineConfig,
    PlacementConfig,
    RewardModelConfig,
    RLConfig,
    SFTConfig,
    TokenizerConfig,
    apply_overrides,
    validate,
)
from posttrain.config.advice import lora_lr_notes
from posttrain.config.algorithm_defaults import apply_algorithm_defaults, describe_taken, explicit_settings
from posttrain.config.checks import DENSE
from posttrain.config.serialize import parse_overrides
from posttrain.envs.tasks import CALCULATOR, GUESS_NUMBER
from posttrain.recipes.pretrained import (
    small_instruct_calculator_cpu,
    small_instruct_cpu,
    small_instruct_lora_cpu,
    small_instruct_sft_rl_cpu,
)


def tiny_cpu() -> PipelineConfig:
    """The embedded default: a ~0.56M-parameter Llama trained from scratch on 2-digit addition, then RL with the
    exact-answer verifier, on a 2-core CPU in minutes.

    Why RL has something to teach, for a reason that does not move with the CPU: the demonstrations come from
    a "sloppy teacher" (`data.demo_error_rate` 0.6) who drops the carry out of the top digit in 60% of them
    ("67+58=" -> "025" instead of "125"; the reference answer stays right). About half of all problems have
    that carry, so SFT, trained to its plateau, imitates the teacher: the greedy answer to those problems is
    wrong and about 40% of samples are right - greedy accuracy ~0.45-0.5, sampled ~0.65 - and RL with the
    verifier corrects it. The SFT budget (2,000 steps x 128) sits on that plateau, well past the rise in
    accuracy (measured, 1 rank at constant lr: 400 steps 0.21 greedy, 1,000 steps 0.69 - still rising with
    the carry half not yet imitated -, 1,500 steps 0.47, 2,200 steps 0.43), so a slightly different float
    rounding moves neither the SFT model's accuracy much nor the gain. The chat layout (newline after the role,
    end-of-turn token and newline between turns; models/tokenizer.py) matters as much: with the earlier
    `<|user|>Q<|assistant|>A<|end|>` layout the same training sat at ~0.02 greedy for three init seeds.
    Measured over seeds (bench/default_seeds.py; see the README): RL raises greedy and sampled accuracy on the
    500 held-out problems by far more than 0.08 for every seed.

    The dense sections, tuned over seeds 0-2 (bench/dense_seeds.py; the README's dense table): DPO is
    SFT-regularised (`dpo.sft_weight` 1, RPO). Plain sigmoid DPO at lr 2e-5, beta 0.1, 75 x 64 pairs reached
    0.978 / 0.972 / 0.844 greedy, and seed 2 sat on a narrow peak: 150 steps 0.774, lr 4e-5 0.772, lr 1e-5 0.490,
    beta 0.3 / 0.5 0.858 / 0.856; with sft_weight 1 it reached 0.976 (seed 0: 0.982). The reward model needs 200
    steps: with 100 seed 2's held-out pairwise accuracy was 0.900, with 200 0.973."""
    return PipelineConfig(
        name="tiny_cpu",
        data=DataConfig(task="addition", num_examples=20000, num_digits=2, eval_size=500, seed=0,
                        demo_error_rate=0.6),
        model=ModelConfig(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4, intermediate_size=512,
                          max_seq_len=32),
        sft=SFTConfig(steps=2000, global_batch_size=128, micro_batch_size=64, lr=3e-3, warmup_steps=20,
                      nproc=2, save_every=500),
        eval=EvalConfig(num_problems=500, k=4, temperature=1.0, max_new_tokens=8),
        rl=RLConfig(steps=100, prompts_per_step=128, samples_per_prompt=8, max_new_tokens=8, lr=5e-5,
                    warmup_steps=10, inner_epochs=1, checkpoint_every=50),
        placement=PlacementConfig(policy_workers=2, rollout_workers=1, rollout_threads=2),
        pairs=PairsConfig(samples_per_prompt=4, max_new_tokens=8),
        dpo=DPOConfig(steps=75, global_batch_size=64, micro_batch_size=32, lr=2e-5, warmup_steps=0, beta=0.1,
                      sft_weight=1.0),
        reward_model=RewardModelConfig(steps=200, global_batch_size=64, micro_batch_size=32, lr=1e-4, warmup_steps=10),
        distill=DistillConfig(steps=2000, global_batch_size=128, micro_batch_size=64, lr=3e-3, warmup_steps=20,
                              save_every=500),
    )


def tiny_cpu_ppo() -> PipelineConfig:
    """tiny_cpu with PPO instead of GRPO: the same batch (128 prompts x 8 samples), steps, policy lr and warm-up,
    plus a critic - the SFT model's body with a fresh value head - at lr 1e-3 that trains alone for the first 5
    steps (its head starts random: explained variance -1.5 at step 1; with the warm-up 0.2 by step 30 and 0.7
    by step 100, seed 0). gamma = lam = 1 (verl's defaults: the outcome is the only reward, so the return of
    every token is the sample's score). Its critic lr of 1e-5 (the default, meant for pretrained models)
    left the value loss at 0.42 after 6 steps; 1e-3 reached 0.08 by step 30."""
    base = tiny_cpu()
    return replace(base, name="tiny_cpu_ppo", rl=replace(base.rl, algorithm=Algorithm.PPO, critic_lr=1e-3,
                                                          critic_warmup_steps=5))


def tiny_cpu_rlhf() -> PipelineConfig:
    """tiny_cpu_ppo for rlhf_pipeline: the reward model it trains from preference pairs of the SFT model's own
    samples is the ONLY reward (`reward.fn_weight` 0); the task's verifier still scores every sample for the
    logs (reward/fn_accuracy) and scores the final evaluation. A KL penalty to the SFT model sits in the reward
    (`rl.kl_coef` 0.1, `rl.kl_in_reward`), as in classic RLHF: without it PPO over-optimised the reward model
    (seed 0: its score rose all run long while the verifier's training accuracy peaked at 0.75 around step 40
    and fell to 0.34; held-out greedy 0.434 -> 0.356); with it, 0.434 -> 0.792."""
    base = tiny_cpu_ppo()
    return replace(base, name="tiny_cpu_rlhf", reward=replace(base.reward, fn_weight=0.0),
                   rl=replace(base.rl, kl_coef=0.1, kl_in_reward=True))


def tiny_cpu_long() -> PipelineConfig:
    """tiny_cpu with correct demonstrations (`data.demo_error_rate` 0): SFT alone gets (nearly) all of the
    addition task right, and RL has little left to do."""
    base = tiny_cpu()
    return replace(base, name="tiny_cpu_long", data=replace(base.data, demo_error_rate=0.0))


def tiny_chain() -> PipelineConfig:
    """tiny_cpu on the multi-step chained-arithmetic task (intermediate results, answer after ####)."""
    base = tiny_cpu()
    return replace(base, name="tiny_chain", data=replace(base.data, task="chain", chain_steps=3, demo_error_rate=0.0),
                   model=replace(base.model, max_seq_len=48),
                   eval=replace(base.eval, max_new_tokens=24), rl=replace(base.rl, max_new_tokens=24))


def tiny_calculator() -> PipelineConfig:
    """agent_pipeline's default: the embedded tiny model learns WHEN to use a tool. The `calculator` task
    (posttrain.envs.tasks) asks for 3-digit x 3-digit products, which a 0.6M-parameter model cannot compute,
    with the Calculator environment's `calculate` tool. The sloppy teacher (`data.demo_error_rate` 0.6) answers
    60% of the problems whose first factor starts with 5-9 in its head, with a wrong estimate, instead of
    calling the tool; SFT imitates it (those problems' greedy answers are guesses), and RL in the environment,
    rewarded by the verifier on the episode's final answer, teaches the policy to call the tool there too.

    The tokenizer merges across words (`data.tokenizer.split_words` false): the tools block every episode
    opens with and the fixed parts of a call become a few tokens, 60 per demonstration instead of 235.

    SFT runs 3,000 steps: copying a 5-digit tool result (16% of the products) is what the SFT model learns last,
    and RL cannot teach it where no sample gets it right. At 1,000 steps seed 2 never learned it (RL greedy
    0.846); at 2,000 seed 1 still miscopied 38 of 96 (RL greedy 0.924, its training accuracy flat from RL step 50
    to 100: bench/results/calculator-seed1-diagnostic-2026-11-28.txt). Checked on seeds outside the docs' table
    before each change: seeds 3 and 4 at 2,000 steps (bench/results/calculator-seeds34-sft2000-2026-11-28.txt),
    seeds 5 and 6 at 3,000 (0.998 and 0.988 from SFT 0.536 and 0.444:
    bench/results/calculator-seeds56-sft3000-2026-11-29.txt); the table's seeds 0-2 are in docs/agents.md."""
    base = tiny_cpu()
    episode = EpisodeConfig(max_turns=3, max_env_tokens=16, max_total_tokens=64)
    return replace(
        base, name="tiny_calculator",
        data=replace(base.data, task="calculator", num_digits=3, demo_error_rate=0.6,
                     tokenizer=TokenizerConfig(vocab_size=768, split_words=False)),
        model=replace(base.model, max_seq_len=96),
        sft=replace(base.sft, steps=3000, save_every=500),
        eval=replace(base.eval, max_new_tokens=16, environment=CALCULATOR, episode=episode),
        rl=replace(base.rl, max_new_tokens=16, prompts_per_step=64, environment=CALCULATOR, episode=episode))


def tiny_guess_number() -> PipelineConfig:
    """agent_pipeline on a truly multi-turn game: the embedded tiny model learns to halve the range. The
    `guess_number` task (posttrain.envs.tasks) plays GuessNumber on 1-32 with at most 7 guesses (binary
    search's worst case plus one); every demonstrated game starts at 16, then the sloppy guesser
    (`data.demo_error_rate` 0.6 of the games) steps by one, the careful one halves. SFT imitates the majority
    after the first answer (greedy: ~13 of the 32 games solved); RL in the environment, rewarded by the verifier
    on the last guess plus the game's own reward (more for fewer guesses), learns to halve. The eval split is
    the 32 secrets, each once; the demonstrations repeat by design (`data.dedupe` false)."""
    base = tiny_cpu()
    episode = EpisodeConfig(max_turns=7, max_env_tokens=16, max_total_tokens=80)
    return replace(
        base, name="tiny_guess_number",
        data=replace(base.data, task="guess_number", num_examples=4000, eval_size=32, demo_error_rate=0.6,
                     dedupe=False, tokenizer=TokenizerConfig(vocab_size=512, split_words=False)),
        model=replace(base.model, max_seq_len=128),
        sft=replace(base.sft, steps=1000, save_every=250),
        eval=replace(base.eval, max_new_tokens=6, environment=GUESS_NUMBER, episode=episode),
        rl=replace(base.rl, max_new_tokens=6, prompts_per_step=64, environment=GUESS_NUMBER, episode=episode))


def gpu_single() -> PipelineConfig:
    """One GPU: the same pipeline with bf16 autocast and one NCCL rank (NCCL refuses 2 ranks on 1 GPU)."""
    base = tiny_cpu()
    return replace(
        base,
        name="gpu_single",
        model=replace(base.model, dtype=DType.BF16),
        sft=replace(base.sft, nproc=1, micro_batch_size=128),
        dpo=replace(base.dpo, micro_batch_size=64),
        reward_model=replace(base.reward_model, micro_batch_size=64),
        distill=replace(base.distill, micro_batch_size=128),
        placement=replace(base.placement, policy_workers=1, gpus_per_worker=0.25),
    )


RECIPES: dict[str, Callable[[], PipelineConfig]] = {
    "tiny_cpu": tiny_cpu,
    "tiny_cpu_ppo": tiny_cpu_ppo,
    "tiny_cpu_rlhf": tiny_cpu_rlhf,
    "tiny_cpu_long": tiny_cpu_long,
    "tiny_chain": tiny_chain,
    "tiny_calculator": tiny_calculator,
    "tiny_guess_number": tiny_guess_number,
    "gpu_single": gpu_single,
    "small_instruct_cpu": small_instruct_cpu,
    "small_instruct_lora_cpu": small_instruct_lora_cpu,
    "small_instruct_sft_rl_cpu": small_instruct_sft_rl_cpu,
    "small_instruct_calculator_cpu": small_instruct_calculator_cpu,
}


WORKFLOW_SECTIONS: dict[str, tuple[str, ...]] = {
    "pipeline": ("pass_rate",),
    "dpo_pipeline": ("pairs", "dpo"),
    "reward_model_pipeline": ("pairs", "reward_model"),
    "distill_pipeline": ("distill",),
    "rlhf_pipeline": ("pairs", "reward_model", "rlhf"),
    "agent_pipeline": ("agent",),
}
"""The sections each workflow uses beyond data/model/sft/eval/rl (validated only there; `pipeline`: the prompt
selection by pass rate before RL); others: none."""


RL_WORKFLOWS = ("pipeline", "agent_pipeline", "rlhf_pipeline", "retrain")
"""The workflows that run the RL stage (the others never read the rl section's learning rate)."""


def resolve(recipe: str = "tiny_cpu", overrides: str | dict = "", *, workflow: str | None = None) -> PipelineConfig:
    """The validated config for recipe `recipe` with JSON `overrides` applied. `workflow` (the Flyte workflow
    that runs it) limits the dense sections checked to the ones it uses; None checks every section."""
    return resolve_with_notes(recipe, overrides, workflow=workflow)[0]


def resolve_with_notes(recipe: str = "tiny_cpu", overrides: str | dict = "", *,
                       workflow: str | None = None) -> tuple[PipelineConfig, list[str]]:
    """`resolve`, and the lines the plan prints about what it filled in: the recipe, then the overrides, then
    the run's algorithm's published defaults for the rl settings neither set (posttrain.config.algorithm_defaults;
    the only place they are applied), then `validate`."""
    if recipe not in RECIPES:
        raise ConfigError(f"recipe: {recipe!r} is not one of {sorted(RECIPES)}")
    sections = DENSE if workflow is None else WORKFLOW_SECTIONS.get(workflow, ())
    base = RECIPES[recipe]()
    cfg = apply_overrides(base, overrides)
    cfg, taken = apply_algorithm_defaults(cfg, explicit_settings(base, parse_overrides(overrides)))
    notes = [describe_taken(cfg, taken)] if taken else []
    cfg = validate(same_ranks(cfg), sections)
    return cfg, notes + lora_lr_notes(cfg, sections, rl_runs=workflow is None or workflow in RL_WORKFLOWS)


def same_ranks(cfg: PipelineConfig) -> PipelineConfig:
    """Every dense objective's section with nproc 0 ("as sft.nproc") given sft.nproc: their tasks all run on the
    one Elastic group that POSTTRAIN_SFT_NPROC sizes, so a user changes the process count in one place."""
    return replace(cfg, **{name: replace(getattr(cfg, name), nproc=getattr(cfg, name).nproc or cfg.sft.nproc)
                           for name in ("dpo", "reward_model", "distill")})
