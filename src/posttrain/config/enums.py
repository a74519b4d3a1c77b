"""The closed sets of choices a config field can take (stored by value in JSON and manifests); rl.algorithm's
live with their declarations in algorithms.py."""

from __future__ import annotations

import enum


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
    PREFERENCE = "preference"  # prompt + chosen + rejected (text, or TRL's conversational lists of messages)


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


class Objective(enum.Enum):
    """What the SPMD dense trainer minimises (each has its own config section: sft, dpo, reward_model, distill)."""
    SFT = "sft"  # cross-entropy on the demonstrations' assistant tokens
    DPO = "dpo"  # direct preference optimisation on (chosen, rejected) pairs against a frozen reference
    REWARD_MODEL = "reward_model"  # Bradley-Terry: a scalar head scores chosen above rejected
    DISTILL = "distill"  # token-level divergence to a frozen teacher's full next-token distribution


class DPOLoss(enum.Enum):
    SIGMOID = "sigmoid"  # -log sigmoid(beta * margin), with optional label smoothing (Rafailov et al. 2023)
    IPO = "ipo"  # (margin - 1 / (2 beta))^2 with length-averaged log-probs (Azar et al. 2023)


class DistillLoss(enum.Enum):
    FORWARD_KL = "forward_kl"  # KL(teacher || student): mass-covering
    REVERSE_KL = "reverse_kl"  # KL(student || teacher): mode-seeking
    JSD = "jsd"  # generalised Jensen-Shannon with mixture weight distill.beta (GKD, Agarwal et al. 2024)


class KLEstimator(enum.Enum):
    K1 = "k1"  # log(p/q)
    K2 = "k2"  # 0.5 * log(p/q)^2
    K3 = "k3"  # exp(-log(p/q)) - 1 + log(p/q)  (unbiased, non-negative)


class MismatchCorrection(enum.Enum):
    """How the policy update corrects for the rollout engine's log-probs differing from the trainer's
    (posttrain.rl.algorithms.mismatch)."""
    OFF = "off"  # the rollout's log-probs are the ratio's old log-probs; only the drift gate watches the gap
    TOKEN_TIS = "token_tis"  # trainer's old log-probs; each token weighted by min(p_old / q, rl.mismatch_cap)
    SEQUENCE_TIS = "sequence_tis"  # ... each sequence by min(prod p_old / q, rl.mismatch_cap)
    TOKEN_MASK = "token_mask"  # ... tokens whose p_old / q leaves [1 / cap, cap] are left out


class LossAgg(enum.Enum):
    TOKEN_MEAN = "token_mean"  # mean over all response tokens of the global batch
    SEQ_MEAN = "seq_mean"  # mean over sequences of each sequence's token mean
    SEQ_MEAN_TOKEN_SUM_NORM = "seq_mean_token_sum_norm"  # token sums / (sequences x rl.max_new_tokens): Dr. GRPO


class PlacementMode(enum.Enum):
    COLOCATED = "colocated"  # roles share the same devices and take turns by phase
    SPLIT = "split"  # each role gets its own devices


class RolloutBackend(enum.Enum):
    TRANSFORMERS = "transformers"
    VLLM = "vllm"
