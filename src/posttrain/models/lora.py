"""LoRA adapters (`model.lora`, through peft): add them to a model, train only them, merge them into plain
weights, and store them as a peft adapter folder.

- **Adding** (`add_adapters`): peft's LoRA layers wrap the targeted `nn.Linear`s in place, so the model keeps its
  class (generate, FSDP2's per-layer sharding and the reward model's head find what they expect). Every base weight
  is frozen; only `lora_A`/`lora_B` (and a reward model's new score head) train, so only they are in the
  optimizer, in the resumable state and in the stored artifact. `lora_B` starts at zero: with adapters added
  the model computes exactly what its base does.
- **The base without adapters** (`adapters_disabled`): the same module with every LoRA layer switched off - the
  reference of KL and DPO with no second copy of the weights.
- **Merging** (`merge_state_dict`): W + (B @ A) * alpha / rank for every adapted weight, computed from a full
  state dict (DDP's, or FSDP2's gathered one), so a rollout engine or an exported folder gets plain weights under
  the base model's own names. Strict: a LoRA tensor it does not consume is an error, never dropped.
- **Storing** (`save_adapter`, `ADAPTER_FILES`): peft's layout - adapter_config.json and
  adapter_model.safetensors with `base_model.model.` names - so `peft.PeftModel.from_pretrained(base, folder)`
  loads it too; the artifact names its base model as its parent (models/folders.py builds the merged folder).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from posttrain.config import LoraConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
"""peft's key prefix in adapter_model.safetensors (a PeftModel wraps the model as base_model.model)."""
NAME = "default"
"""The one adapter a model carries here (peft's default adapter name)."""


def peft_config(cfg: LoraConfig, *, extra_trainable: tuple[str, ...] = ()):
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                          target_modules=list(cfg.target_modules), bias="none",
                          modules_to_save=list(extra_trainable) or None)


def add_adapters(model: torch.nn.Module, cfg: LoraConfig, *, seed: int,
                 extra_trainable: tuple[str, ...] = ()) -> torch.nn.Module:
    """`model` with LoRA layers on `cfg.target_modules` (A drawn from `seed`, B zero), every other weight frozen
    apart from the modules named in `extra_trainable` (a reward model's score head); returns the same module."""
    from peft import inject_adapter_in_model

    missing = [t for t in cfg.target_modules
               if not any(n.split(".")[-1] == t and isinstance(m, torch.nn.Linear) for n, m in model.named_modules())]
    if missing:
        linear = sorted({n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"model.lora.target_modules: {missing} name no linear layer of this "
                         f"{type(model).__name__}; its linear layers: {linear}")
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if tied and "lm_head" in cfg.target_modules:
        raise ValueError("model.lora.target_modules: 'lm_head' is this model's input embedding too "
                         "(tie_word_embeddings), so an adapter on it cannot be merged into a plain model; leave it out")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(peft_config(cfg), model, adapter_name=NAME)  # the head stays a plain module
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter_param(name) or name.split(".")[0] in extra_trainable)
    return model


def is_adapter_param(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def has_adapters(model: torch.nn.Module) -> bool:
    return any(is_adapter_param(n) for n, _ in model.named_parameters())


def _lora_layers(model: torch.nn.Module) -> list:
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module):
    """Inside the block the model computes its base (every LoRA layer off); outside, the adapters are back on."""
    layers = _lora_layers(getattr(model, "module", model))
    if not layers:
        raise ValueError("adapters_disabled: the model has no LoRA adapters")
    for m in layers:
        m.enable_adapters(False)
    try:
        yield model
    finally:
        for m in layers:
            m.enable_adapters(True)


class MergedView(Mapping):
    """A LoRA model's full state dict seen as the base architecture's: `<layer>.weight` of every adapted layer is
    `<layer>.base_layer.weight` + B @ A * alpha / rank (in fp32, cast back), computed when it is read - so
    streaming the weights to a file or a checksum never holds a second full copy. Other tensors are the model's
    own (`source` gives the tensor each name is read from: tied weights share it). Strict: a LoRA tensor that
    belongs to no adapted linear layer is an error, never dropped."""

    def __init__(self, sd: Mapping[str, torch.Tensor], cfg: LoraConfig):
        self.sd, self.scale = sd, cfg.alpha / cfg.rank
        self.names: dict[str, str] = {}  # merged name -> the state dict's name it is read from
        used: set[str] = set()
        for k in sd:
            if k.endswith(".base_layer.weight"):
                layer = k.removesuffix(".base_layer.weight")
                pair = {f"{layer}.lora_A.{NAME}.weight", f"{layer}.lora_B.{NAME}.weight"}
                if not pair <= set(sd):
                    raise ValueError(f"merge_state_dict: {layer} has a base layer but no lora_A/lora_B weights")
                used |= pair
        for k in sd:
            if ".lora_" in k:
                if k not in used:
                    raise ValueError(f"merge_state_dict: LoRA tensor {k} belongs to no adapted linear layer")
                continue
            self.names[k.replace(".base_layer.", ".")] = k  # a bias of an adapted layer goes back under its name

    def source(self, name: str) -> torch.Tensor:
        """The tensor `name` is read from, as stored (a mapping that computes its entries when read - e.g. the
        gathered weights of an FSDP2 model - gives its own source: nothing is computed here)."""
        inner = getattr(self.sd, "source", None)
        return inner(self.names[name]) if inner is not None else self.sd[self.names[name]]

    def __getitem__(self, name: str) -> torch.Tensor:
        src = self.names[name]
        w = self.sd[src]
        if not src.endswith(".base_layer.weight"):
            return w
        layer = src.removesuffix(".base_layer.weight")
        a, b = self.sd[f"{layer}.lora_A.{NAME}.weight"], self.sd[f"{layer}.lora_B.{NAME}.weight"]
        with torch.no_grad():
            return (w.float() + (b.float() @ a.float()) * self.scale).to(w.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def merge_state_dict(sd: Mapping[str, torch.Tensor], cfg: LoraConfig) -> dict[str, torch.Tensor]:
    """A full state dict with LoRA layers -> the base architecture's state dict with every adapted weight merged
    (`MergedView`, materialised); a state dict without LoRA tensors comes back as it is."""
    return dict(MergedView(sd, cfg))


def adapter_state_dict(sd: dict[str, torch.Tensor], extra_trainable: tuple[str, ...] = ()
                       ) -> dict[str, torch.Tensor]:
    """The adapter's own tensors of a full state dict - LoRA's and those of the `extra_trainable` modules -
    under peft's saved names (no adapter name, the PeftModel prefix): what adapter_model.safetensors holds."""
    out = {}
    for k, v in sd.items():
        if is_adapter_param(k):
            out[PEFT_PREFIX + k.replace(f".{NAME}.", ".")] = v.detach().to("cpu").contiguous()
        elif k.split(".")[0] in extra_trainable:
            out[PEFT_PREFIX + k] = v.detach().to("cpu").contiguous()
    return out


def save_adapter(sd: dict[str, torch.Tensor], cfg: LoraConfig, out_dir: str | Path, *, base: str,
                 extra_trainable: tuple[str, ...] = ()) -> None:
    """adapter_config.json + adapter_model.safetensors (peft's layout) of the adapter in full state dict `sd`;
    `base` is recorded as the config's base_model_name_or_path (the base model artifact id here)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = adapter_state_dict(sd, extra_trainable)
    if not any(is_adapter_param(k) for k in tensors):
        raise ValueError("save_adapter: the state dict holds no LoRA tensors")
    save_file(tensors, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    pc = peft_config(cfg, extra_trainable=extra_trainable)
    pc.base_model_name_or_path = base
    d = pc.to_dict()
    d = {k: (sorted(v) if isinstance(v, set) else v) for k, v in d.items()}
    (out / ADAPTER_CONFIG).write_text(json.dumps(d, indent=2, sort_keys=True, default=str) + "\n")


def is_adapter_dir(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def read_adapter(folder: str | Path) -> tuple[LoraConfig, dict[str, torch.Tensor], tuple[str, ...]]:
    """(the LoRA settings, the tensors under in-model names, the extra trainable modules) of an adapter folder."""
    d = Path(folder)
    pc = json.loads((d / ADAPTER_CONFIG).read_text())
    if pc.get("peft_type") != "LORA" or pc.get("use_rslora") or pc.get("use_dora"):
        raise ValueError(f"{d}: only plain LoRA adapters are read here (peft_type LORA without rsLoRA/DoRA), "
                         f"got {pc.get('peft_type')}")
    targets = pc["target_modules"]
    cfg = LoraConfig(rank=int(pc["r"]), alpha=float(pc["lora_alpha"]), dropout=float(pc.get("lora_dropout") or 0.0),
                     target_modules=sorted(targets) if isinstance(targets, list) else [targets])
    extra = tuple(pc.get("modules_to_save") or ())
    tensors = {}
    for k, v in load_file(str(d / ADAPTER_WEIGHTS)).items():
        k = k.removeprefix(PEFT_PREFIX)
        if ".lora_A." in k or ".lora_B." in k:
            k = k.replace(".lora_A.", f".lora_A.{NAME}.").replace(".lora_B.", f".lora_B.{NAME}.")
        elif k.split(".")[0] not in extra:
            raise ValueError(f"{d / ADAPTER_WEIGHTS}: tensor {k} is neither LoRA's nor a module in modules_to_save")
        tensors[k] = v
    return cfg, tensors, extra


def merged_with_adapter(base_sd: dict[str, torch.Tensor], folder: str | Path) -> dict[str, torch.Tensor]:
    """The base model's state dict with the adapter in `folder` merged in (names of the base architecture)."""
    cfg, tensors, _ = read_adapter(folder)
    sd: dict[str, torch.Tensor] = {}
    adapted = {k.split(".lora_A.")[0] for k in tensors if ".lora_A." in k}
    for k, v in base_sd.items():
        layer, _, leaf = k.rpartition(".")
        if layer in adapted:
            sd[f"{layer}.base_layer.{leaf}"] = v
        else:
            sd[k] = v
    sd.update(tensors)  # LoRA's tensors, and a trained head replacing the base's
    missing = sorted(f"{a}.weight" for a in adapted if f"{a}.base_layer.weight" not in sd)
    if missing:
        raise ValueError(f"{folder}: the adapter adapts layers its base model lacks: {missing[:3]}")
    return merge_state_dict(sd, cfg)


def set_adapter_base(folder: str | Path, base: str) -> None:
    """Record `base` (the base model artifact, as `posttrain:<id>`) as adapter_config.json's
    base_model_name_or_path - not the machine's folder, which would make the artifact's content id depend on it."""
    path = Path(folder) / ADAPTER_CONFIG
    d = json.loads(path.read_text())
    d["base_model_name_or_path"] = base
    path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
