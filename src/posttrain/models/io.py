"""Load and save HF model folders: safetensors only, never remote code, never a pickle.

Loading (`load_tokenizer`, `load_model`, `eos_token_ids`):
- **Pad token.** Every tokenizer comes back with one: its own, else its EOS token (logged once per folder).
  That is safe here because no code of ours finds padding by token id: generation pads on the left under an
  attention mask and cuts each row at its first stop token; SFT labels and RL response masks come from
  lengths and the chat template, never from `input_ids == pad_id`, so a real EOS keeps its loss. A
  tokenizer with neither a pad nor an EOS token is refused, naming the folder.
- **Stop tokens.** `eos_token_ids` is the union of generation_config.json's `eos_token_id` (an int or a
  list; config.json's when there is no generation_config.json) and the tokenizer's EOS token - instruct
  models often end a turn with a token that is not the tokenizer's EOS.
- **dtype.** `compute_dtype`: bf16 only on CUDA and only when asked (ModelConfig.dtype BF16); on CPU always
  fp32. Training keeps fp32 weights and runs the forward under `torch.autocast(bfloat16)`; generation,
  reference and eval models are loaded in bf16.

Saving (`save_model`) writes a folder that transformers 5.x AND 4.57 load unchanged. transformers 5 writes
things 4.57 misreads, so the folder is patched after `save_pretrained`:
- config.json: `rope_theta` also at the top level (5.x keeps it only inside `rope_parameters`; 4.57 then
  silently uses 10000 and generates gibberish), `rope_scaling` for non-default rope types, no
  `quantization_config`;
- tokenizer_config.json: `tokenizer_class: PreTrainedTokenizerFast` when tokenizer.json describes the
  tokenizer (5.x writes `TokenizersBackend`, which 4.57 lacks), `model_input_names`, the chat template
  inline (besides chat_template.jinja), extra special tokens as the list 4.57 expects;
- generation_config.json: every EOS id (the model's own and the tokenizer's) and the pad id.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel
from transformers.utils import logging as hf_logging

from posttrain.config import DType

hf_logging.disable_progress_bar()
log = logging.getLogger(__name__)
_pad_fallback_logged: set[str] = set()


# ------------------------------------------------------------------------------------------- loading


def load_tokenizer(model_dir: str | Path):
    """The folder's tokenizer, with a pad token guaranteed (its own, else its EOS token)."""
    tok = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"{model_dir}: the tokenizer has neither a pad token nor an EOS token; set "
                             "`pad_token` or `eos_token` in its tokenizer_config.json (posttrain pads batches "
                             "and stops generation with them)")
        tok.pad_token = tok.eos_token
        if str(model_dir) not in _pad_fallback_logged:
            _pad_fallback_logged.add(str(model_dir))
            log.warning("%s: the tokenizer has no pad token; using its EOS token %r as pad (padded positions "
                        "are masked and never get loss)", model_dir, tok.eos_token)
    return tok


def _as_ids(v) -> list[int]:
    if v is None:
        return []
    return [int(v)] if isinstance(v, int) else [int(x) for x in v]


def eos_token_ids(model_dir: str | Path, tokenizer=None) -> list[int]:
    """Every token id that ends a response: generation_config.json's `eos_token_id` (config.json's when the
    folder has no generation_config.json), then the tokenizer's EOS token; duplicates dropped, order kept."""
    d = Path(model_dir)
    ids: list[int] = []
    src = d / "generation_config.json" if (d / "generation_config.json").exists() else d / "config.json"
    if src.exists():
        ids += _as_ids(json.loads(src.read_text()).get("eos_token_id"))
    tok = tokenizer if tokenizer is not None else load_tokenizer(d)
    ids += _as_ids(tok.eos_token_id)
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise ValueError(f"{d}: no EOS token id in generation_config.json, config.json or the tokenizer; "
                         "generation would never stop")
    return ids


def local_device() -> torch.device:
    """The device this process should compute on: CUDA when it is available and - inside a Ray actor - Ray
    assigned this actor a GPU (Ray then sets CUDA_VISIBLE_DEVICES, so the GPU is the current device)."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    try:
        import ray

        if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None and not ray.get_gpu_ids():
            return torch.device("cpu")
    except ImportError:
        pass
    return torch.device("cuda", torch.cuda.current_device())


def compute_dtype(dtype: DType | torch.dtype | str | None, device: str | torch.device) -> torch.dtype:
    """bf16 on CUDA when asked for (DType.BF16, "bf16" or torch.bfloat16); fp32 otherwise and always on CPU."""
    if torch.device(device).type != "cuda" or dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    return torch.bfloat16 if DType(dtype) == DType.BF16 else torch.float32


def load_model(model_dir: str | Path, device: str | torch.device = "cpu",
               dtype: DType | torch.dtype | str | None = None) -> PreTrainedModel:
    """The folder's causal LM on `device` in eval mode; weights in `compute_dtype(dtype, device)`."""
    d = Path(model_dir)
    if not any(d.glob("*.safetensors")):
        raise FileNotFoundError(f"{d}: no *.safetensors weights (posttrain loads safetensors only, never pickles)")
    model = AutoModelForCausalLM.from_pretrained(str(d), use_safetensors=True, trust_remote_code=False,
                                                 dtype=compute_dtype(dtype, device), attn_implementation="sdpa")
    return model.to(device).eval()


def enable_gradient_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder layer in the backward pass (HF's per-layer checkpointing, non-reentrant: the
    reentrant variant does not mix with DDP's no_sync and drops gradients when the layer inputs do not
    require grad). Only active while the model is in training mode. Call before wrapping in DDP/FSDP2."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


# ------------------------------------------------------------------------------------------- saving


def save_model(model: PreTrainedModel, tokenizer, out_dir: str | Path) -> None:
    """Weights (safetensors), config, tokenizer and generation config, readable by transformers 5.x and 4.57."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = getattr(model, "module", model)
    if not hasattr(model, "generation_config"):  # not a generative model (a reward model): nothing to complete
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        _portable_config(out / "config.json")
        _portable_tokenizer_config(out, tokenizer)
        return
    own = model.generation_config
    gen = copy.deepcopy(own) if own is not None else GenerationConfig()
    eos = list(dict.fromkeys(_as_ids(gen.eos_token_id) + _as_ids(tokenizer.eos_token_id)))
    gen.eos_token_id = eos[0] if len(eos) == 1 else (eos or None)
    gen.pad_token_id = tokenizer.pad_token_id
    gen._from_model_config = False  # else generate() may rebuild it from config.json, losing the EOS list
    try:  # save with the completed generation config without changing the caller's model
        model.generation_config = gen
        model.save_pretrained(out, safe_serialization=True)
    finally:
        model.generation_config = own
    tokenizer.save_pretrained(out)
    _portable_config(out / "config.json")
    _portable_tokenizer_config(out, tokenizer)


def _portable_rope(cfg: dict) -> None:
    rp = cfg.get("rope_parameters")
    if not isinstance(rp, dict) or "rope_theta" not in rp:  # absent, or one dict per layer type (4.57 cannot)
        return
    cfg.setdefault("rope_theta", rp["rope_theta"])
    if rp.get("rope_type", "default") != "default" and not cfg.get("rope_scaling"):
        cfg["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}


def _portable_config(path: Path) -> None:
    cfg = json.loads(path.read_text())
    cfg.pop("quantization_config", None)
    _portable_rope(cfg)
    if isinstance(cfg.get("text_config"), dict):
        _portable_rope(cfg["text_config"])
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _portable_tokenizer_config(out: Path, tokenizer) -> None:
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text()) if path.exists() else {}
    if (out / "tokenizer.json").exists():  # the whole pipeline is in tokenizer.json: the generic fast class reads it
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["model_input_names"] = ["input_ids", "attention_mask"]
    if tokenizer.chat_template:
        cfg["chat_template"] = tokenizer.chat_template
    extra = cfg.get("extra_special_tokens")
    if isinstance(extra, list):  # 5.x writes a list here; 4.57 expects a dict and reads the list from this key
        cfg.pop("extra_special_tokens")
        cfg["additional_special_tokens"] = extra
    if cfg.get("pad_token") is None and tokenizer.pad_token is not None:
        cfg["pad_token"] = tokenizer.pad_token
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------------------------------- checks


def check_same_tokenizer(a_dir: str | Path, b_dir: str | Path, *, names: tuple[str, str]) -> None:
    """Refuse two models whose tokenizers differ (vocabulary, pad/EOS tokens, chat template), naming both:
    a token-level comparison (DPO's reference, a distillation teacher) between them would be meaningless."""
    a, b = load_tokenizer(a_dir), load_tokenizer(b_dir)
    diffs = []
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        only = sorted(set(va) ^ set(vb))[:3]
        moved = [t for t in va if t in vb and va[t] != vb[t]][:3]
        diffs.append(f"vocabularies differ ({len(va)} vs {len(vb)} tokens"
                     + (f"; e.g. only in one: {only}" if only else "") + (f"; other ids: {moved}" if moved else "") + ")")
    for attr in ("eos_token", "pad_token"):
        if getattr(a, attr) != getattr(b, attr):
            diffs.append(f"{attr} {getattr(a, attr)!r} vs {getattr(b, attr)!r}")
    if (a.chat_template or "") != (b.chat_template or ""):
        diffs.append("chat templates differ")
    if diffs:
        raise ValueError(f"{names[0]} ({a_dir}) and {names[1]} ({b_dir}) must share a tokenizer: " + "; ".join(diffs))
