"""The SPMD SFT trainer: every rank runs the same `train_step` on its own shard.

Loss: the mean over all assistant tokens of the GLOBAL batch. Before a step the ranks all-reduce their
assistant-token counts; each micro-batch then contributes sum(token losses) / global_count, multiplied by
world_size because DDP (and FSDP2's reduce-scatter) average gradients across ranks. So 1 rank x 4
micro-batches and 2 ranks x 2 micro-batches give the same loss and the same update.

Resumable state (every `sft.save_every` steps, atomically): model + optimizer via torch.distributed.checkpoint
(sharded for FSDP2), the step (which fixes the data cursor and the learning rate), RNG states and the wandb
run id. Kept in `state_dir` - a local folder or an fsspec URL under the store's root (artifacts/state.py), so
a retry on another node resumes - apart from the model artifact that rank 0 writes to `out_dir` at the end.

Precision and memory: weights and optimizer state stay fp32; with model.dtype BF16 on CUDA the forward runs
under torch.autocast(bfloat16) (on CPU everything is fp32). model.gradient_checkpointing recomputes each
decoder layer in the backward pass (non-reentrant torch.utils.checkpoint, which works under DDP's no_sync,
FSDP2 and the packed 4D masks; tested: same loss and gradients as without it).

Leaves out: tensor/pipeline parallelism, dropout (none in the tiny models).

    run_sft(model_cfg=..., sft_cfg=..., tracking_cfg=..., dataset_dir=..., tokenizer_dir=..., base_model_dir=None,
            out_dir=..., state_dir=..., run_name="sft")   # on every rank, e.g. under torchrun or Elastic
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from posttrain.artifacts.state import StateDir, read_file, write_file
from posttrain.config import ModelConfig, Parallelism, SFTConfig, TrackingConfig
from posttrain.data.chat import tokenize_for_training
from posttrain.data.examples import read_examples
from posttrain.models.io import enable_gradient_checkpointing, load_model, load_tokenizer, save_model
from posttrain.models.tiny import build_model
from posttrain.sft.batching import Batch, collate, rank_order, token_losses
from posttrain.sft.dist import DistInfo, all_reduce_sum, init_distributed
from posttrain.tracking import Tracker
from posttrain.wandb_run import WandbRun


def lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to cfg.lr * min_lr_ratio at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def wrap(model: torch.nn.Module, cfg: SFTConfig, info: DistInfo, *, gradient_checkpointing: bool = False
         ) -> torch.nn.Module:
    """Move to this rank's device, enable activation checkpointing if asked (before wrapping: it replaces the
    decoder layers' call), then wrap in DDP or FSDP2. The model is left in training mode."""
    model.to(info.device).train()
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if cfg.parallelism == Parallelism.FSDP2:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        return fully_shard(model)
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=[info.device.index] if info.device.type == "cuda"
                                                     else None)


def make_optimizer(model: torch.nn.Module, cfg: SFTConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def _sync_context(model: torch.nn.Module, cfg: SFTConfig, last: bool):
    """Gradient all-reduce only on the last micro-batch of a step."""
    if cfg.parallelism == Parallelism.FSDP2:
        model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if last else model.no_sync()


class NonFiniteError(RuntimeError):
    """A NaN or infinite SFT loss or gradient norm: the step stopped before its optimizer step."""


def train_step(model, optimizer, micro_batches: list[Batch], *, cfg: SFTConfig, info: DistInfo,
               lr: float, autocast: bool) -> dict:
    """One optimizer step over this rank's micro-batches; identical on every rank."""
    counts = torch.tensor([sum(b.num_loss_tokens for b in micro_batches), sum(b.num_tokens for b in micro_batches)],
                          dtype=torch.float64, device=info.device)
    global_loss_tokens, global_tokens = all_reduce_sum(counts).tolist()
    for g in optimizer.param_groups:
        g["lr"] = lr
    loss_sum = torch.zeros((), dtype=torch.float64, device=info.device)
    for i, b in enumerate(micro_batches):
        with _sync_context(model, cfg, last=i == len(micro_batches) - 1):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=b.input_ids.to(info.device), position_ids=b.position_ids.to(info.device),
                               attention_mask=b.attention_mask.to(info.device), use_cache=False).logits  # (B, T, V)
            loss = token_losses(logits, b.labels.to(info.device)).sum() / global_loss_tokens
            (loss * info.world_size).backward()
            loss_sum += loss.detach().double()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                               cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf"))
    loss_total = all_reduce_sum(loss_sum).item()
    gn = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    if not (math.isfinite(loss_total) and math.isfinite(float(gn))):  # same on every rank: all stop together
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(f"SFT step stopped before the optimizer step: loss {loss_total}, gradient norm "
                             f"{float(gn)} (rank {info.rank}); the weights and the last saved state are unchanged")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss_total, "grad_norm": float(gn), "lr": lr, "tokens": int(global_tokens),
            "loss_tokens": int(global_loss_tokens)}


class Shards:
    """This rank's micro-batches for a given step: the cursor is a pure function of the step."""

    def __init__(self, encoded: list[tuple[list[int], list[int]]], cfg: SFTConfig, info: DistInfo, pad_id: int,
                 pack_length: int):
        self.encoded, self.cfg, self.info, self.pad_id, self.pack_length = encoded, cfg, info, pad_id, pack_length
        self.accum = cfg.global_batch_size // (cfg.micro_batch_size * info.world_size)
        self.per_step = cfg.micro_batch_size * self.accum  # examples per rank per step
        self.per_epoch = (len(encoded) // info.world_size) // self.per_step
        if self.per_epoch < 1:
            raise ValueError(f"sft.global_batch_size={cfg.global_batch_size} is larger than the training set "
                             f"({len(encoded)} examples)")
        self._orders: dict[int, list[int]] = {}

    def for_step(self, step: int) -> list[Batch]:
        epoch, k = divmod(step, self.per_epoch)
        if epoch not in self._orders:
            self._orders = {epoch: rank_order(len(self.encoded), epoch, self.cfg.seed, self.info.rank,
                                              self.info.world_size)}
        idx = self._orders[epoch][k * self.per_step:(k + 1) * self.per_step]
        m = self.cfg.micro_batch_size
        return [collate([self.encoded[i] for i in idx[j:j + m]], pack=self.cfg.packing,
                        pack_length=self.pack_length, pad_id=self.pad_id) for j in range(0, len(idx), m)]


def _check_world(cfg: SFTConfig, info: DistInfo) -> None:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", info.world_size))
    if local != cfg.nproc:
        raise ValueError(f"sft.nproc={cfg.nproc} but the launcher started {local} processes per node "
                         f"(Elastic nproc_per_node / POSTTRAIN_SFT_NPROC); make them agree")
    if cfg.global_batch_size % (cfg.micro_batch_size * info.world_size):
        raise ValueError(f"sft.global_batch_size={cfg.global_batch_size} must be a multiple of "
                         f"sft.micro_batch_size * world_size = {cfg.micro_batch_size * info.world_size}")


HISTORY_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s")
"""The per-step numbers `run_sft` keeps in its history (stages.sft stores it in the model manifest's extra)."""


def run_sft(*, model_cfg: ModelConfig, sft_cfg: SFTConfig, tracking_cfg: TrackingConfig, dataset_dir, tokenizer_dir,
            base_model_dir, out_dir, state_dir, run_name: str = "sft", wandb_run: WandbRun | None = None) -> dict:
    """Train on every rank; returns rank 0's last metrics and per-step history. `wandb_run` (rank 0's, from
    posttrain.wandb_run): started here - continuing the saved run id on a resume - and finished by the caller."""
    # Ranks forked by Elastic inherit the parent's torch thread pool, and torch reads OMP_NUM_THREADS only
    # once: without this, N ranks x all-cores threads spin against each other (measured ~100x slower).
    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    info = init_distributed(sft_cfg.backend)
    _check_world(sft_cfg, info)
    torch.manual_seed(sft_cfg.seed)
    if base_model_dir:
        tokenizer, model = load_tokenizer(base_model_dir), load_model(base_model_dir)
    else:
        tokenizer = load_tokenizer(tokenizer_dir)
        model = build_model(model_cfg, tokenizer)
    pack_length = sft_cfg.pack_length or model_cfg.max_seq_len
    encoded, dropped = encode_train_split(dataset_dir, tokenizer, min(model_cfg.max_seq_len, pack_length))
    model = wrap(model, sft_cfg, info, gradient_checkpointing=model_cfg.gradient_checkpointing)
    optimizer = make_optimizer(model, sft_cfg)
    shards = Shards(encoded, sft_cfg, info, tokenizer.pad_token_id, pack_length)
    state = state_dir if isinstance(state_dir, StateDir) else StateDir(state_dir)
    start, wandb_id, history = load_state(state, model, optimizer)
    tracker = Tracker(tracking_cfg, info.rank, run_name, total=sft_cfg.steps, start=start, wandb_run=wandb_run,
                      wandb_id=wandb_id)
    autocast = info.device.type == "cuda" and model_cfg.dtype.value == "bf16"
    metrics: dict = {}
    t_start = time.perf_counter()
    for step in range(start, sft_cfg.steps):
        t0 = time.perf_counter()
        try:
            metrics = train_step(model, optimizer, shards.for_step(step), cfg=sft_cfg, info=info,
                                 lr=lr_at(step, sft_cfg), autocast=autocast)
        except NonFiniteError as e:
            raise NonFiniteError(f"step {step + 1}: {e}") from None
        metrics["tokens_per_s"] = metrics["tokens"] / (time.perf_counter() - t0)
        tracker.log(step, metrics)
        done = step + 1
        history.append({"step": done, **{k: metrics[k] for k in HISTORY_KEYS}})
        if (sft_cfg.save_every and done % sft_cfg.save_every == 0) or done == sft_cfg.steps:
            save_state(state, model, optimizer, done, tracker.wandb_id, info, history)
    tracker.close()
    save_final(model, model_cfg, tokenizer, base_model_dir, out_dir, info)
    return {**{k: v for k, v in metrics.items()}, "steps": sft_cfg.steps, "world_size": info.world_size,
            "train_examples": len(encoded), "dropped_too_long": dropped,
            "wall_s": time.perf_counter() - t_start, "history": history}


def encode_train_split(dataset_dir, tokenizer, max_len: int) -> tuple[list, int]:
    """(token ids and labels of every train conversation that ends with an assistant turn and fits `max_len`,
    how many were too long); refuses a split with nothing to train on."""
    encoded, dropped = [], 0
    for ex in read_examples(dataset_dir, "train"):
        if ex["messages"][-1]["role"] != "assistant":
            continue
        enc = tokenize_for_training(tokenizer, ex["messages"], max_len)
        if enc is None:
            dropped += 1
        else:
            encoded.append(enc)
    if not encoded:
        raise ValueError(f"no trainable examples in {dataset_dir}: SFT needs conversations ending with an assistant "
                         f"turn no longer than {max_len} tokens (model.max_seq_len / sft.pack_length; "
                         f"{dropped} too long)")
    return encoded, dropped


def save_final(model, model_cfg: ModelConfig, tokenizer, base_model_dir, out_dir, info: DistInfo) -> None:
    """Gather the full weights (every rank takes part) and rank 0 writes them as an HF folder: into a fresh
    model of the config, or of the base folder's architecture."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if info.rank == 0:
        final = build_model(model_cfg, tokenizer) if not base_model_dir else load_model(base_model_dir)
        final.load_state_dict(full, strict=False)
        if "lm_head.weight" not in full:
            final.tie_weights()
        save_model(final, tokenizer, out_dir)
    dist.barrier()


def save_state(state: StateDir, model, optimizer, step: int, wandb_id: str | None, info: DistInfo,
               history: list[dict]) -> None:
    """Every rank writes its part into step-N (torch.distributed.checkpoint: a path, or fsspec for a URL), then
    rank 0 commits it by writing step-N/meta.json last and drops older folders. A folder without meta.json
    (a kill while saving) is never loaded, and is cleared when that step is saved again."""
    name = f"step-{step:07d}"
    if info.rank == 0:
        state.remove(name)
    dist.barrier()
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=state.url(name))
    write_file(state.url(name, f"rng-rank{info.rank}.pt"), lambda p: torch.save({"cpu_rng": torch.get_rng_state()}, p))
    dist.barrier()
    if info.rank == 0:
        state.write_text(f"{name}/meta.json", json.dumps({"step": step, "wandb_id": wandb_id,
                                                          "world_size": info.world_size, "history": history}))
        for old in state.names("step-"):
            if old != name:
                state.remove(old)
    dist.barrier()


def load_state(state: StateDir, model, optimizer) -> tuple[int, str | None, list[dict]]:
    """Restore the newest committed state; returns (step to start from, wandb run id, per-step history so far:
    empty for state saved before histories were kept). When it resumes, rank 0
    prints `sft: resuming at step N of saved state <folder>` (N: the first step run now, as the metric lines
    number it; steps before it are not redone)."""
    done = [n for n in state.names("step-") if state.exists(f"{n}/meta.json")]
    if not done:
        return 0, None, []
    last = done[-1]
    meta = json.loads(state.read_text(f"{last}/meta.json"))
    if meta["world_size"] != dist.get_world_size():
        raise ValueError(f"saved SFT state {state.url(last)} was written by {meta['world_size']} ranks, not "
                         f"{dist.get_world_size()}")
    msd, osd = get_state_dict(model, optimizer)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=state.url(last))
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    rng = f"{last}/rng-rank{dist.get_rank()}.pt"
    if state.exists(rng):
        torch.set_rng_state(read_file(state.url(rng), lambda p: torch.load(p, weights_only=True))["cpu_rng"])
    if dist.get_rank() == 0:
        print(f"sft: resuming at step {meta['step']} of saved state {state.url(last)}", flush=True)
    return meta["step"], meta.get("wandb_id"), meta.get("history", [])
