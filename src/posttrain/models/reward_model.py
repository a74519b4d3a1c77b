"""Reward models: a causal LM's body with a scalar head, as transformers' `AutoModelForSequenceClassification`
(num_labels 1), so a saved reward model loads unchanged with `from_pretrained` (transformers 5.x and 4.57).

The head is read at a sequence's rightmost token that is not the pad id (transformers' pooling rule). Training
calls the head at every position through `TokenScores` instead of the pooled forward, so packed rows (several
sequences in one row) can be scored; `posttrain.sft.batching` records where each sequence is read, by the same
rule. `score_conversations` scores with the pooled HF forward - what a user of the saved folder gets.

    rm = build_reward_model(base_dir, tokenizer)       # a fresh scalar head on the base model's body
    scores = score_conversations(rm, tok, [[{"role": "user", ...}, {"role": "assistant", ...}], ...])
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from posttrain.config import ModelConfig


class TokenScores(torch.nn.Module):
    """The reward model's head at every position: forward -> (B, T) scores (wrap this in DDP/FSDP2)."""

    def __init__(self, rm: PreTrainedModel):
        super().__init__()
        self.rm = rm

    def forward(self, input_ids, position_ids, attention_mask) -> torch.Tensor:
        body = getattr(self.rm, self.rm.base_model_prefix)
        hidden = body(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                      use_cache=False).last_hidden_state  # (B, T, H)
        return self.rm.score(hidden).squeeze(-1)  # (B, T)


def build_reward_model(base_dir: str | Path | None, tokenizer, model_cfg: ModelConfig | None = None
                       ) -> PreTrainedModel:
    """The base folder's body (or a fresh tiny model of `model_cfg`) with a new scalar head; the head's
    initialisation follows torch's seed. The pad id is set in the config: pooling needs it."""
    if base_dir is not None:
        rm = AutoModelForSequenceClassification.from_pretrained(str(base_dir), num_labels=1, use_safetensors=True,
                                                                trust_remote_code=False, attn_implementation="sdpa")
    else:
        from posttrain.models.tiny import build_model

        lm = build_model(model_cfg, tokenizer)
        cfg = copy.deepcopy(lm.config)
        cfg.num_labels = 1
        rm = AutoModelForSequenceClassification.from_config(cfg, attn_implementation="sdpa")
        getattr(rm, rm.base_model_prefix).load_state_dict(getattr(lm, lm.base_model_prefix).state_dict())
    rm.config.pad_token_id = tokenizer.pad_token_id
    rm.config.problem_type = "regression"
    return rm


def load_reward_model(model_dir: str | Path, device: str | torch.device = "cpu") -> PreTrainedModel:
    d = Path(model_dir)
    if not any(d.glob("*.safetensors")):
        raise FileNotFoundError(f"{d}: no *.safetensors weights (posttrain loads safetensors only, never pickles)")
    rm = AutoModelForSequenceClassification.from_pretrained(str(d), use_safetensors=True, trust_remote_code=False,
                                                            attn_implementation="sdpa")
    if rm.config.num_labels != 1:
        raise ValueError(f"{d}: a reward model has one output (num_labels 1), this one has {rm.config.num_labels}")
    return rm.to(device).eval()


@torch.no_grad()
def score_conversations(rm: PreTrainedModel, tokenizer, conversations: list[list[dict]], *,
                        batch_size: int = 64) -> list[float]:
    """The reward model's score of each whole conversation (rendered with the tokenizer's chat template),
    through its own pooled forward on right-padded batches."""
    device = next(rm.parameters()).device
    out: list[float] = []
    for i in range(0, len(conversations), batch_size):
        texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in conversations[i:i + batch_size]]
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        T = max(len(x) for x in ids)
        input_ids = torch.full((len(ids), T), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(ids), T), dtype=torch.long)
        for r, x in enumerate(ids):
            input_ids[r, :len(x)] = torch.tensor(x)
            mask[r, :len(x)] = 1
        logits = rm(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits  # (B, 1)
        out += logits[:, 0].float().tolist()
    return out
