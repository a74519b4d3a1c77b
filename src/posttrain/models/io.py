"""Load and save HF model folders: safetensors only, never remote code, never a pickle."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()


def load_tokenizer(model_dir: str | Path):
    return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)


def load_model(model_dir: str | Path, device: str = "cpu", dtype: torch.dtype | None = None) -> PreTrainedModel:
    d = Path(model_dir)
    if not any(d.glob("*.safetensors")):
        raise FileNotFoundError(f"{d}: no *.safetensors weights (posttrain loads safetensors only, never pickles)")
    model = AutoModelForCausalLM.from_pretrained(str(d), use_safetensors=True, trust_remote_code=False,
                                                 dtype=dtype or torch.float32, attn_implementation="sdpa")
    return model.to(device).eval()


def save_model(model: PreTrainedModel, tokenizer, out_dir: str | Path) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = getattr(model, "module", model)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                               do_sample=False)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
