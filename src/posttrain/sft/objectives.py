"""What the SPMD trainer minimises: one class per dense objective, chosen by the trainer config's class
(`posttrain.config.objective_of`: SFTConfig -> SFT, DPOConfig -> DPO, RewardModelConfig -> reward model,
DistillConfig -> distillation).

Each objective says how an example becomes sequences (`encode`), which counts normalise its loss over the
GLOBAL batch (`counts`, all-reduced before the step), and the loss of one micro-batch (`loss`). A micro-batch's
loss is sum(item losses) / global count, so 1 rank x 4 micro-batches and 2 ranks x 2 give the same update
(the trainer multiplies by world_size because DDP and FSDP2 average gradients). Statistics come back as sums
and are divided by the global counts after an all-reduce, so the logged numbers do not depend on the split
either. The math itself lives in `losses.py` as pure functions.

    SFT        cross-entropy on the assistant tokens; mean over the global batch's assistant tokens
    DPO        pairs: chosen = sequence 2i, rejected = 2i+1 of a micro-batch; summed completion log-probs of
               the policy and of a frozen reference (token-mean for IPO); mean over the global batch's pairs,
               plus sft_weight x cross-entropy of the chosen completions (mean over their tokens)
    reward     pairs: a scalar head read at each sequence's last non-pad token; Bradley-Terry, mean over pairs
    distill    every assistant token: divergence between the student's and a frozen teacher's next-token
               distributions; mean over the global batch's assistant tokens

The frozen model (DPO's reference, the distillation teacher) lives on every rank and runs its forward in the
same micro-batch, without gradients. The alternative - one pass before training that stores its numbers with
the run's state - was weighed: DPO's reference numbers are one float per sequence, but a teacher's full
next-token distributions are V floats per token (49k for SmolLM2: ~200 KB per token in fp32), far too many to
store; and the recipes here make about one pass over their pairs, so a pre-pass would cost the same forwards.
One mechanism for both, then; its memory is one more copy of the weights per rank (no gradients, no optimizer).

Leaves out: sequence packing of DPO/RM pairs across micro-batches (a pair always sits in one micro-batch), KTO
and other unpaired preference losses, margins in the reward-model loss, and top-k teacher logits.
"""

from __future__ import annotations

import torch

from posttrain.config import DistillConfig, DPOConfig, DPOLoss, Objective, RewardModelConfig, SFTConfig, objective_of
from posttrain.data.chat import tokenize_for_training
from posttrain.models.attention_bias import attention_bias
from posttrain.sft.batching import IGNORE, Batch, Sequence, sequence_sums, token_losses
from posttrain.sft.losses import bradley_terry_losses, distill_token_losses, dpo_losses
from posttrain.spmd import precision


def _logits(model, b: Batch, device, autocast: bool) -> torch.Tensor:
    with precision.autocast(autocast):
        return model(input_ids=b.input_ids.to(device), position_ids=b.position_ids.to(device),
                     attention_mask=attention_bias(b.attention_mask, model, device),
                     use_cache=False).logits  # (B, T, V)


def _demonstration(example: dict) -> list[dict]:
    """The conversation SFT (and distillation) trains on: the example's turns, or for a preference pair the
    prompt followed by the chosen completion."""
    return example["messages"] + example["chosen"] if "chosen" in example else example["messages"]


class SFTObjective:
    """Cross-entropy on the demonstrations' assistant tokens."""

    name = Objective.SFT
    history_keys = ("loss",)
    pairs = False

    def encode(self, example: dict, tokenizer, max_len: int) -> tuple[Sequence, ...] | None:
        enc = tokenize_for_training(tokenizer, _demonstration(example), max_len)
        return None if enc is None else (enc,)

    def trains_on(self, example: dict) -> bool:
        return _demonstration(example)[-1]["role"] == "assistant"

    def counts(self, batches: list[Batch]) -> dict[str, float]:
        return {"loss_tokens": float(sum(b.num_loss_tokens for b in batches))}

    def loss(self, model, frozen, b: Batch, counts: dict, device, autocast: bool) -> tuple[torch.Tensor, dict]:
        labels = b.labels.to(device)
        loss = token_losses(_logits(model, b, device, autocast), labels).sum() / counts["loss_tokens"]
        return loss, {"loss": loss.detach().double()}

    def metrics(self, sums: dict, counts: dict) -> dict:
        return {"loss": sums["loss"], "loss_tokens": int(counts["loss_tokens"])}


class _PairObjective:
    """Shared by DPO and the reward model: an example is a (chosen, rejected) pair of conversations."""

    pairs = True

    def encode(self, example: dict, tokenizer, max_len: int) -> tuple[Sequence, ...] | None:
        prompt = example["messages"]
        chosen = tokenize_for_training(tokenizer, prompt + example["chosen"], max_len)
        rejected = tokenize_for_training(tokenizer, prompt + example["rejected"], max_len)
        return None if chosen is None or rejected is None else (chosen, rejected)

    def trains_on(self, example: dict) -> bool:
        return "chosen" in example and "rejected" in example

    def counts(self, batches: list[Batch]) -> dict[str, float]:
        chosen_tokens = sum(int((b.labels != IGNORE).logical_and(b.seq_index % 2 == 0).sum()) for b in batches)
        return {"pairs": float(sum(b.num_sequences // 2 for b in batches)), "chosen_tokens": float(chosen_tokens),
                "loss_tokens": float(sum(b.num_loss_tokens for b in batches))}

    @staticmethod
    def _pair_stats(losses, chosen, rejected, n_pairs: float) -> dict:
        return {"loss": losses.detach().double().sum() / n_pairs, "chosen": chosen.double().sum(),
                "rejected": rejected.double().sum(), "accuracy": (chosen > rejected).double().sum()}

    @staticmethod
    def _pair_metrics(sums: dict, counts: dict, prefix: str) -> dict:
        n = counts["pairs"]
        return {f"{prefix}chosen": sums["chosen"] / n, f"{prefix}rejected": sums["rejected"] / n,
                f"{prefix}margin": (sums["chosen"] - sums["rejected"]) / n, "accuracy": sums["accuracy"] / n,
                "pairs": int(n)}


class DPOObjective(_PairObjective):
    """DPO (sigmoid, IPO) against the frozen reference, optionally SFT-regularised (RPO)."""

    name = Objective.DPO
    history_keys = ("loss", "rewards/chosen", "rewards/rejected", "rewards/margin", "accuracy")

    def __init__(self, cfg: DPOConfig):
        self.cfg = cfg

    def _logps(self, logits: torch.Tensor, b: Batch, labels: torch.Tensor, seq_index: torch.Tensor):
        """(summed log-probs (N,), token counts (N,)) of every sequence's loss tokens."""
        logp = -token_losses(logits, labels)  # (B, T), 0 off the loss tokens
        n = b.num_sequences
        tokens = sequence_sums(torch.ones_like(logp), labels, seq_index, n)
        return sequence_sums(logp, labels, seq_index, n), tokens

    def loss(self, model, frozen, b: Batch, counts: dict, device, autocast: bool) -> tuple[torch.Tensor, dict]:
        labels, seq_index = b.labels.to(device), b.seq_index.to(device)
        logits = _logits(model, b, device, autocast)
        pol, tokens = self._logps(logits, b, labels, seq_index)  # (N,)
        with torch.no_grad():
            ref, _ = self._logps(_logits(frozen, b, device, autocast), b, labels, seq_index)
        ipo = self.cfg.loss == DPOLoss.IPO  # IPO compares token-mean log-probs
        a, r = (pol / tokens, ref / tokens) if ipo else (pol, ref)
        losses, chosen, rejected = dpo_losses(a[0::2], a[1::2], r[0::2], r[1::2], beta=self.cfg.beta,
                                              loss=self.cfg.loss, label_smoothing=self.cfg.label_smoothing)
        if ipo:  # the logged implicit rewards stay beta x the summed log-ratio, whatever the loss (as TRL logs them)
            rewards = (self.cfg.beta * (pol - ref)).detach()  # (N,)
            chosen, rejected = rewards[0::2], rewards[1::2]
        loss = losses.sum() / counts["pairs"]
        stats = self._pair_stats(losses, chosen, rejected, counts["pairs"])
        if self.cfg.sft_weight > 0:
            chosen_tokens = labels.masked_fill(seq_index % 2 == 1, IGNORE)  # the chosen completions only
            nll = token_losses(logits, chosen_tokens).sum() / counts["chosen_tokens"]
            loss = loss + self.cfg.sft_weight * nll
            stats["nll"] = nll.detach().double()
        stats["loss"] = loss.detach().double()
        return loss, stats

    def metrics(self, sums: dict, counts: dict) -> dict:
        out = {"loss": sums["loss"], **self._pair_metrics(sums, counts, "rewards/")}
        if "nll" in sums:
            out["nll"] = sums["nll"]
        return out


class RewardModelObjective(_PairObjective):
    """Bradley-Terry: the score of the chosen completion above the rejected one's."""

    name = Objective.REWARD_MODEL
    history_keys = ("loss", "scores/chosen", "scores/rejected", "scores/margin", "accuracy")

    def __init__(self, cfg: RewardModelConfig):
        self.cfg = cfg

    def loss(self, model, frozen, b: Batch, counts: dict, device, autocast: bool) -> tuple[torch.Tensor, dict]:
        with precision.autocast(autocast):
            scores = model(input_ids=b.input_ids.to(device), position_ids=b.position_ids.to(device),
                           attention_mask=attention_bias(b.attention_mask, model, device))  # (B, T): head everywhere
        r = scores.float().reshape(-1)[b.pool_index.to(device)]  # (N,)
        losses = bradley_terry_losses(r[0::2], r[1::2], center_rewards_coef=self.cfg.center_rewards_coef)
        loss = losses.sum() / counts["pairs"]
        return loss, self._pair_stats(losses, r[0::2].detach(), r[1::2].detach(), counts["pairs"])

    def metrics(self, sums: dict, counts: dict) -> dict:
        return {"loss": sums["loss"], **self._pair_metrics(sums, counts, "scores/")}


class DistillObjective(SFTObjective):
    """Per-token divergence to the frozen teacher's next-token distribution on the demonstrations' tokens."""

    name = Objective.DISTILL
    history_keys = ("loss", "ce")

    def __init__(self, cfg: DistillConfig):
        self.cfg = cfg

    def loss(self, model, frozen, b: Batch, counts: dict, device, autocast: bool) -> tuple[torch.Tensor, dict]:
        labels = b.labels.to(device)
        keep = labels != IGNORE  # (B, T)
        student = _logits(model, b, device, autocast)[keep]  # (M, V)
        with torch.no_grad():
            teacher = _logits(frozen, b, device, autocast)[keep]  # (M, V)
        per_token = distill_token_losses(student.float(), teacher.float(), loss=self.cfg.loss, beta=self.cfg.beta,
                                         temperature=self.cfg.temperature)  # (M,)
        loss = per_token.sum() / counts["loss_tokens"]
        ce = torch.nn.functional.cross_entropy(student.detach().float(), labels[keep], reduction="sum")
        return loss, {"loss": loss.detach().double(), "ce": ce.double() / counts["loss_tokens"]}

    def metrics(self, sums: dict, counts: dict) -> dict:
        return {"loss": sums["loss"], "ce": sums["ce"], "loss_tokens": int(counts["loss_tokens"])}


def objective_for(cfg: SFTConfig):
    """The objective a trainer config section asks for."""
    match objective_of(cfg):
        case Objective.DPO:
            return DPOObjective(cfg)
        case Objective.REWARD_MODEL:
            return RewardModelObjective(cfg)
        case Objective.DISTILL:
            return DistillObjective(cfg)
        case Objective.SFT:
            return SFTObjective()
