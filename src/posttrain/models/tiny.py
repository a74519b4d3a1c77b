"""A tiny Llama or Qwen2 causal LM initialised from scratch with the dataset's tokenizer."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from posttrain.config import Arch, ModelConfig


def build_model(cfg: ModelConfig, tokenizer) -> PreTrainedModel:
    common = {"vocab_size": len(tokenizer), "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
              "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
              "intermediate_size": cfg.intermediate_size, "max_position_embeddings": max(cfg.max_seq_len, 64),
              "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id, "bos_token_id": None,
              "tie_word_embeddings": True, "attn_implementation": "sdpa"}
    torch.manual_seed(cfg.init_seed)
    if cfg.arch == Arch.LLAMA:
        return LlamaForCausalLM(LlamaConfig(**common))
    return Qwen2ForCausalLM(Qwen2Config(**common))
