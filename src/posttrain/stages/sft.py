"""The SFT stage and every dense objective (DPO, reward model, distillation): resolve the start and frozen
models, skip work on a cache hit, train on every rank of the SPMD group, store the result with its manifest on
rank 0 and return its handle."""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from posttrain.artifacts import ArtifactRef, ArtifactStore
from posttrain.artifacts.state import StateDir
from posttrain.config import (
    ConfigError,
    DistillConfig,
    DPOConfig,
    ModelConfig,
    Objective,
    SFTConfig,
    TrackingConfig,
    objective_of,
    to_dict,
)
from posttrain.models.folders import model_folder
from posttrain.models.refs import model_ref, start_model
from posttrain.stages.support import (
    check_budget,
    drop_state,
    finished_on_error,
    source_digest,
    without_keep_state,
)
from posttrain.tracking.wandb_run import WandbRun

if TYPE_CHECKING:
    from posttrain.data.lengths import LengthReport


def sft_cache_key(store: ArtifactStore, model: ModelConfig, sft: SFTConfig, dataset: ArtifactRef,
                  tokenizer: ArtifactRef | None, start: ArtifactRef | None, frozen: ArtifactRef | None = None) -> str:
    # The start model counts by its content id, not by where the user's folder lies; so do the frozen model and
    # the start model for the settings that name them (dpo.reference, distill.teacher).
    model_part = {**to_dict(model), "base_path": "", "artifact": ""}
    if model.lora is None or start is None:  # LoRA only adapts a start model; unset, the key is as it always was
        model_part.pop("lora")
    objective = objective_of(sft)
    cfg = without_keep_state(sft)
    for named in ("reference", "teacher"):
        cfg.pop(named, None)
    parts = (model_part, cfg, dataset.id, tokenizer.id if tokenizer else None, start.id if start else None)
    if objective == Objective.SFT:  # SFT's key has no frozen-model part
        return store.cache_key("sft", *parts, source_digest("sft", "spmd", "models", "data/chat.py"))
    return store.cache_key(objective.value, *parts, frozen.id if frozen else None,
                           source_digest("sft", "spmd", "models", "data/chat.py"))


def sft(model: ModelConfig, sft_cfg: SFTConfig, tracking: TrackingConfig, *, dataset: ArtifactRef,
        tokenizer: ArtifactRef | None, run_id: str, start: ArtifactRef | None = None,
        store: ArtifactStore | None = None) -> ArtifactRef | None:
    """Run on every rank of the SPMD group. Rank 0 stores the checkpoint and returns its handle.

    `start` is the model to fine-tune (from `start_model`; resolved here from `model` when not given, None
    for a from-scratch model). Its weights are loaded from the artifact's folder, so what lineage records is
    what was trained. With `sft.enabled` false, `start` is returned as it is, untrained."""
    return train(model, sft_cfg, tracking, dataset=dataset, tokenizer=tokenizer, run_id=run_id, start=start,
                 store=store)


def train(model: ModelConfig, cfg: SFTConfig, tracking: TrackingConfig, *, dataset: ArtifactRef,
          tokenizer: ArtifactRef | None, run_id: str, start: ArtifactRef | None = None,
          frozen: ArtifactRef | None = None, store: ArtifactStore | None = None) -> ArtifactRef | None:
    """Any dense objective - SFT, DPO, reward model, distillation: `cfg`'s class decides (posttrain.sft.objectives)
    - on every rank of the SPMD group; rank 0 stores the result and returns its handle (a `reward_model` artifact
    for a reward model, a `model` otherwise), whose parents are the dataset, the tokenizer, the start model and
    the frozen model (DPO's reference, the teacher).

    `frozen`: the DPO reference (default: `start`) or the distillation teacher (resolved from distill.teacher
    when not given). A distilled student without a start model is built fresh with the TEACHER's tokenizer
    (`tokenizer` is then not used); every frozen model must share the trained model's tokenizer (checked first)."""
    store = store or ArtifactStore()
    objective = objective_of(cfg)
    stage = objective.value
    rank = int(os.environ.get("RANK", "0"))
    if start is None and (model.base_path or model.artifact):
        start = start_model(model, run_id=run_id, store=store)  # same content -> same id on every rank
    if not cfg.enabled:
        if start is None:
            raise ConfigError(f"{stage}.enabled: false needs a model to start from: set model.base_path or "
                              "model.artifact")
        if rank == 0:
            print(f"{stage}: disabled ({stage}.enabled=false): passing model {start.short} through untrained")
        return start if rank == 0 else None
    frozen = frozen_model(cfg, start, frozen, run_id, store)
    if objective == Objective.DISTILL:
        tokenizer = None  # the student speaks the teacher's tokens
    key = sft_cache_key(store, model, cfg, dataset, tokenizer, start, frozen)
    hit = store.cache_get(key)
    if hit is not None:  # every rank sees the same hit, so no rank waits on a collective
        if rank == 0:
            print(f"{stage}: cache hit -> {hit.kind} {hit.short}")
        return hit if rank == 0 else None

    return _train_fresh(model, cfg, tracking, key=key, dataset=dataset, tokenizer=tokenizer, start=start,
                        frozen=frozen, run_id=run_id, store=store)


def _train_fresh(model: ModelConfig, cfg: SFTConfig, tracking: TrackingConfig, *, key: str, dataset: ArtifactRef,
                 tokenizer: ArtifactRef | None, start: ArtifactRef | None, frozen: ArtifactRef | None, run_id: str,
                 store: ArtifactStore) -> ArtifactRef | None:
    """`train` past its cache: check what can be checked before any work, train (resuming the state the key
    names), store and cache the result on rank 0, then drop the state."""
    from posttrain.models.io import check_same_tokenizer
    from posttrain.sft import run_sft

    objective = objective_of(cfg)
    stage, rank = objective.value, int(os.environ.get("RANK", "0"))
    ds_dir, base_dir = store.get(dataset), model_folder(store, start) if start else None
    frozen_dir = model_folder(store, frozen) if frozen else None
    tok_dir = frozen_dir if objective == Objective.DISTILL else (store.get(tokenizer) if tokenizer else None)
    if frozen is not None and base_dir is not None:  # one vocabulary, or the token-level math is meaningless
        check_same_tokenizer(base_dir, frozen_dir, names=(f"the start model {start.short}",
                                                         f"{_frozen_setting(objective)} {frozen.short}"))
    # Every rank measures (cheap), so that all of them stop on a budget that cannot fit.
    lengths = check_budget(ds_dir, base_dir or tok_dir, max_seq_len=model.max_seq_len, max_new_tokens=0, sft=True,
                           setting="")
    cfg = with_token_budget(cfg, lengths, stage)  # the same steps on every rank: the same rows, the same tokenizer
    state = StateDir.under_store(store.root, stage, key)  # stable across retries and nodes: a killed run resumes
    if rank == 0:
        print(f"{stage}: state in {state}", flush=True)
    inputs = {"dataset": dataset.id, "tokenizer": tokenizer.id if tokenizer else None,
              "start_model": start.id if start else None}
    if frozen is not None:
        inputs[_frozen_setting(objective).split(".")[-1]] = frozen.id
    wandb_run = WandbRun.for_stage(tracking, stage=stage, run_id=run_id, store=store,
                                   settings={"model": model, stage: cfg}, inputs=inputs) if rank == 0 else None
    with finished_on_error(wandb_run), tempfile.TemporaryDirectory(prefix=f"posttrain-{stage}-") as tmp:
        out_dir = Path(tmp) / "model"
        metrics = run_sft(model_cfg=model, sft_cfg=cfg, tracking_cfg=tracking, dataset_dir=ds_dir,
                          tokenizer_dir=tok_dir, base_model_dir=base_dir, out_dir=out_dir,
                          state_dir=state, run_name=f"{stage}-{run_id}", wandb_run=wandb_run,
                          frozen_model_dir=frozen_dir)
        history = metrics.pop("history")  # per-step numbers: the manifest's extra, which the id does not cover
        if rank != 0:
            return None
        kind = "reward_model" if objective == Objective.REWARD_MODEL else "model"
        from posttrain.models.lora import is_adapter_dir, set_adapter_base

        adapter = is_adapter_dir(out_dir)  # trained with model.lora: the adapter, on top of the start model
        if adapter:
            set_adapter_base(out_dir, f"posttrain:{start.id}")
        parents = ([dataset.id] + ([tokenizer.id] if tokenizer else []) + ([start.id] if start else [])
                   + ([frozen.id] if frozen and frozen != start else []))
        ref = store.put(kind, f"{stage}-{dataset.name}", out_dir, run_id=run_id, parents=parents,
                        config={"model": to_dict(model), stage: to_dict(cfg)}, metrics=metrics,
                        extra={"start_model": start.id if start else None, "stage": stage, "history": history,
                               **({"frozen_model": frozen.id} if frozen else {}),
                               **({"adapter_of": start.id} if adapter else {})},
                        world_size=int(os.environ.get("WORLD_SIZE", "1")))
        if wandb_run is not None:
            wandb_run.finish(outputs={kind: ref.id})
    store.cache_put(key, ref)
    if not cfg.keep_state:  # only after the model is stored: a failed run keeps its state and resumes
        drop_state(state)
    print(f"{stage}: {kind} {ref.short} (final loss {metrics.get('loss', float('nan')):.4f})")
    return ref


def with_token_budget(cfg: SFTConfig, lengths: LengthReport, stage: str) -> SFTConfig:
    """`cfg` with its steps worked out from `<stage>.tokens` and the train split's measured conversations:
    ceil(tokens / (global_batch_size x their mean length)); unchanged when the budget is `steps`. Refused
    (ConfigError) when the warm-up would not fit in the steps the budget gives."""
    if not cfg.tokens:
        return cfg
    mean = lengths.total_conversation_tokens / lengths.num_rows
    steps = math.ceil(cfg.tokens / (cfg.global_batch_size * mean))
    how = (f"{stage}.tokens={cfg.tokens} gives {steps} steps of {cfg.global_batch_size} examples (the "
           f"{lengths.num_rows} train rows hold {mean:.1f} tokens each on average)")
    if cfg.warmup_steps >= steps:
        raise ConfigError(f"{stage}.warmup_steps={cfg.warmup_steps} does not fit: {how}; lower the warm-up or raise "
                          f"the budget")
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{stage}: {how}", flush=True)
    return replace(cfg, steps=steps)


def _frozen_setting(objective: Objective) -> str:
    return {Objective.DPO: "dpo.reference", Objective.DISTILL: "distill.teacher"}[objective]


def frozen_model(cfg: SFTConfig, start: ArtifactRef | None, given: ArtifactRef | None, run_id: str,
                  store: ArtifactStore) -> ArtifactRef | None:
    """The objective's frozen model: DPO's reference (dpo.reference, else the start model), the distillation
    teacher (distill.teacher, required); None for SFT and reward models."""
    if given is not None:
        return given
    if isinstance(cfg, DPOConfig):
        if cfg.reference:
            return model_ref(cfg.reference, "dpo.reference", run_id=run_id, store=store)
        if start is None:
            raise ConfigError("dpo.reference: DPO needs a reference model: give dpo.reference, or start DPO from a "
                              "model (model.base_path / model.artifact, or after SFT)")
        return start
    if isinstance(cfg, DistillConfig):
        if not cfg.teacher:
            raise ConfigError("distill.teacher: distillation needs a teacher: a model artifact id, a local HF "
                              "folder or channel:NAME")
        return model_ref(cfg.teacher, "distill.teacher", run_id=run_id, store=store)
    return None
