"""The dense objectives' sections beside SFT (docs/dense.md): preference pairs from a model's own samples, and
DPO, reward-model and distillation settings - each a subclass of `SFTConfig`, so every trainer field means the
same in each section and the class picks the objective (`posttrain.config.pipeline.objective_of`)."""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.config.enums import DistillLoss, DPOLoss, RolloutBackend
from posttrain.config.sections import SFTConfig


@dataclass(frozen=True, kw_only=True)
class PairsConfig:
    """Preference pairs made from a model's own samples (dpo_pipeline and reward_model_pipeline on prompt data):
    k completions per prompt from the rollout engine, scored by the reward function; a prompt whose samples hold
    at least one correct (score >= 1) and one wrong answer gives one pair (the first correct as chosen, the first
    wrong as rejected); other prompts give none."""
    samples_per_prompt: int = 4
    """Completions sampled per prompt (k)."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling (1.0: off)."""
    top_k: int = 0
    """Top-k sampling (0: off)."""
    max_new_tokens: int = 16
    """Generation limit per completion."""
    max_prompts: int = 0
    """Train prompts sampled from (the first ones of the train split); 0: all of them."""
    eval_prompts: int = 0
    """Eval-split prompts sampled for the held-out pairs (the reward model's pairwise accuracy); 0: all."""
    batch_size: int = 256
    """Prompts per generation batch (transformers engine)."""
    seed: int = 0
    """Sampling seed."""
    backend: RolloutBackend = RolloutBackend.TRANSFORMERS
    """Generation engine: "transformers", or "vllm" (a separate install: `make install-vllm`)."""


@dataclass(frozen=True, kw_only=True)
class DPOConfig(SFTConfig):
    """DPO on (prompt, chosen, rejected) pairs, run by the SPMD trainer that runs SFT: every SFTConfig field
    (steps, batches, lr schedule, parallelism, ranks, state) means the same here, for pairs instead of
    demonstrations (a batch of 64 holds 64 pairs: 128 sequences)."""
    nproc: int = 0
    """Processes per node; 0: sft.nproc (every dense objective's task runs on the one Elastic group that
    POSTTRAIN_SFT_NPROC sizes, so the two must agree)."""
    steps: int = 75
    global_batch_size: int = 64
    micro_batch_size: int = 32
    lr: float = 2e-5
    warmup_steps: int = 0
    save_every: int = 25
    loss: DPOLoss = DPOLoss.SIGMOID
    """`sigmoid` (the DPO paper's loss) or `ipo`."""
    beta: float = 0.1
    """Strength of the implicit KL constraint: rewards are beta * (log pi - log pi_ref) of a completion."""
    label_smoothing: float = 0.0
    """sigmoid only: the assumed share of flipped labels (conservative DPO); 0 is plain DPO."""
    sft_weight: float = 0.0
    """The SFT-regularised variant (RPO): adds this times the cross-entropy of the chosen completions (mean
    over their tokens in the global batch) to the loss; 0 is plain DPO."""
    share_prompt: bool = True
    """Lay each pair out as ONE row, the prompt once and then both completions, each attending to the prompt and
    itself (a 4D mask; the same logits as two rows, float rounding aside): the prompt goes through the model
    once instead of twice. False: two rows, as TRL's trainers do."""
    reference: str = ""
    """The frozen reference model: a `model` artifact id (or unique prefix), a local HF folder, or
    `channel:NAME`; "" is the model DPO starts from."""


@dataclass(frozen=True, kw_only=True)
class RewardModelConfig(SFTConfig):
    """A Bradley-Terry reward model: the base model with a scalar head (AutoModelForSequenceClassification,
    num_labels 1) scoring the last token, trained so that chosen scores above rejected; run by the SPMD trainer
    that runs SFT, every SFTConfig field meaning the same for pairs."""
    nproc: int = 0
    """Processes per node; 0: sft.nproc (every dense objective's task runs on the one Elastic group that
    POSTTRAIN_SFT_NPROC sizes, so the two must agree)."""
    steps: int = 100
    global_batch_size: int = 64
    micro_batch_size: int = 32
    lr: float = 1e-4
    warmup_steps: int = 10
    save_every: int = 50
    share_prompt: bool = True
    """Lay each pair out as ONE row, the prompt once and then both completions, each attending to the prompt and
    itself (a 4D mask; the same logits as two rows, float rounding aside): the prompt goes through the model
    once instead of twice. False: two rows, as TRL's trainers do."""
    center_rewards_coef: float = 0.0
    """Adds this times mean((r_chosen + r_rejected)^2) to the loss, keeping scores centred on 0 (TRL's
    center_rewards_coefficient); 0: off."""


@dataclass(frozen=True, kw_only=True)
class DistillConfig(SFTConfig):
    """Logit distillation: on the demonstrations' assistant tokens the student matches a frozen teacher's full
    next-token distribution; run by the SPMD trainer that runs SFT, every SFTConfig field meaning the same.
    The student is the start model (model.base_path / model.artifact), or a fresh model of the `model`
    section built with the teacher's tokenizer; teacher and student must share a tokenizer."""
    nproc: int = 0
    """Processes per node; 0: sft.nproc (every dense objective's task runs on the one Elastic group that
    POSTTRAIN_SFT_NPROC sizes, so the two must agree)."""
    teacher: str = ""
    """The teacher: a `model` artifact id (or unique prefix), a local HF folder, or `channel:NAME`. Required."""
    loss: DistillLoss = DistillLoss.FORWARD_KL
    """`forward_kl` KL(teacher||student), `reverse_kl` KL(student||teacher), or `jsd` (generalised JSD)."""
    beta: float = 0.5
    """jsd only: the mixture weight, M = beta * teacher + (1 - beta) * student (0 < beta < 1)."""
    temperature: float = 1.0
    """Both distributions are softmax(logits / temperature)."""
