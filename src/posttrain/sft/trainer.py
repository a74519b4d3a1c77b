"""The SPMD dense trainer: every rank runs the same `train_step` on its own shard. It trains every dense
objective - SFT, DPO, reward models, distillation (objectives.py; the config section's class picks one) - with
the same ranks, batching, normalisation, parallelism, checkpointing and resume.

Loss (SFT; the others normalise the same way by their own global counts, objectives.py): the mean over all
assistant tokens of the GLOBAL batch. Before a step the ranks all-reduce their
assistant-token counts; each micro-batch then contributes sum(token losses) / global_count, multiplied by
world_size because DDP (and FSDP2's reduce-scatter) average gradients across ranks. So 1 rank x 4
micro-batches and 2 ranks x 2 micro-batches give the same loss and the same update.

Resumable state (every `sft.save_every` steps, atomically; checkpoint.py): model + optimizer via
torch.distributed.checkpoint (sharded for FSDP2), the step (which fixes the data cursor and the learning rate), RNG states and the wandb
run id. Kept in `state_dir` - a local folder or an fsspec URL under the store's root (artifacts/state.py), so
a retry on another node resumes - apart from the model artifact that rank 0 writes to `out_dir` at the end.

Precision and memory: weights and optimizer state stay fp32; with model.dtype BF16 on CUDA the forward runs
under torch.autocast(bfloat16) (on CPU everything is fp32). model.gradient_checkpointing recomputes each
decoder layer in the backward pass (non-reentrant torch.utils.checkpoint, which works under DDP's no_sync,
FSDP2 and the packed 4D masks; tested: same loss and gradients as without it).

Leaves out: tensor/pipeline parallelism, dropout (none in the tiny models).

    run_sft(model_cfg=..., sft_cfg=..., tracking_cfg=..., dataset_dir=..., tokenizer_dir=..., base_model_dir=None,
            out_dir=..., state_dir=..., run_name="sft")   # on every rank, e.g. under torchrun or Elastic
    run_sft(..., sft_cfg=DPOConfig(...), frozen_model_dir=REFERENCE)    # DPO; DistillConfig + the teacher: KD
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from posttrain.artifacts.state import StateDir
from posttrain.config import LoraConfig, ModelConfig, Objective, SFTConfig, TrackingConfig, objective_of
from posttrain.data.examples import read_examples
from posttrain.models.io import load_model, load_tokenizer, save_model
from posttrain.models.lora import adapters_disabled, add_adapters, save_adapter
from posttrain.models.reward_model import TokenScores, build_reward_model
from posttrain.models.tiny import build_model
from posttrain.sft.batching import Batch, collate_units, rank_order
from posttrain.sft.checkpoint import load_state, save_state
from posttrain.sft.objectives import SFTObjective, objective_for
from posttrain.spmd import parallel, precision
from posttrain.spmd.dist import DistInfo, all_reduce_sum, init_distributed
from posttrain.spmd.optim import adamw
from posttrain.tracking import Tracker
from posttrain.tracking.wandb_run import WandbRun


def lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to cfg.lr * min_lr_ratio at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def wrap(model: torch.nn.Module, cfg: SFTConfig, info: DistInfo, *, gradient_checkpointing: bool = False
         ) -> torch.nn.Module:
    """The trainee as the group trains it (`spmd.parallel.wrap`: DDP or FSDP2 per `sft.parallelism`)."""
    return parallel.wrap(model, cfg.parallelism, info, gradient_checkpointing=gradient_checkpointing)


def make_optimizer(model: torch.nn.Module, cfg: SFTConfig) -> torch.optim.Optimizer:
    """AdamW over the parameters that train (all of them, or with LoRA only the adapters and a reward head)."""
    return adamw(model, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)


class NonFiniteError(RuntimeError):
    """A NaN or infinite SFT loss or gradient norm: the step stopped before its optimizer step."""


def train_step(model, optimizer, micro_batches: list[Batch], *, cfg: SFTConfig, info: DistInfo,
               lr: float, autocast: bool, objective=None, frozen=None) -> dict:
    """One optimizer step over this rank's micro-batches; identical on every rank. `objective` (objectives.py;
    SFT when not given) computes each micro-batch's loss; `frozen` is its frozen model (reference, teacher)."""
    objective = objective or SFTObjective()
    counts = objective.counts(micro_batches)
    names = sorted(counts)
    reduced = all_reduce_sum(torch.tensor([counts[k] for k in names] + [sum(b.num_tokens for b in micro_batches)],
                                          dtype=torch.float64, device=info.device)).tolist()
    counts, global_tokens = dict(zip(names, reduced[:-1])), reduced[-1]
    for g in optimizer.param_groups:
        g["lr"] = lr
    sums: dict[str, torch.Tensor] = {}
    for i, b in enumerate(micro_batches):
        with parallel.grad_sync(model, last=i == len(micro_batches) - 1):
            loss, stats = objective.loss(model, frozen, b, counts, info.device, autocast)
            (loss * info.world_size).backward()
        for k, v in stats.items():
            sums[k] = sums.get(k, 0) + v
    gn = parallel.clip_grad_norm(model, cfg.max_grad_norm)
    keys = sorted(sums)  # the same keys on every rank: the config decides them
    totals = dict(zip(keys, all_reduce_sum(torch.stack([torch.as_tensor(sums[k], dtype=torch.float64,
                                                                         device=info.device) for k in keys])).tolist()))
    loss_total = totals["loss"]
    if not (math.isfinite(loss_total) and math.isfinite(float(gn))):  # same on every rank: all stop together
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(f"{objective.name.value} step stopped before the optimizer step: loss {loss_total}, "
                             f"gradient norm {float(gn)} (rank {info.rank}); the weights and the last saved state are "
                             f"unchanged")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {**objective.metrics(totals, counts), "grad_norm": float(gn), "lr": lr, "tokens": int(global_tokens)}


class Shards:
    """This rank's micro-batches for a given step: the cursor is a pure function of the step."""

    def __init__(self, encoded: list[tuple[tuple[list[int], list[int]], ...]], cfg: SFTConfig, info: DistInfo,
                 pad_id: int, pack_length: int):
        """`encoded`: one tuple of (ids, loss mask) sequences per example - one for SFT, (chosen, rejected) for
        pairs; an example's sequences always go into the same micro-batch, in order."""
        self.encoded, self.cfg, self.info, self.pad_id, self.pack_length = encoded, cfg, info, pad_id, pack_length
        self.share_prefix = getattr(cfg, "share_prompt", False)  # pair objectives: the prompt once per pair
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
        return [collate_units([self.encoded[i] for i in idx[j:j + m]], pack=self.cfg.packing,
                              pack_length=self.pack_length, pad_id=self.pad_id, share_prefix=self.share_prefix)
                for j in range(0, len(idx), m)]


def _check_world(cfg: SFTConfig, info: DistInfo) -> None:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", info.world_size))
    name = objective_of(cfg).value  # the config section: sft, dpo, reward_model, distill
    if cfg.nproc and local != cfg.nproc:  # 0 (a dense section's "as sft.nproc", unresolved): any
        raise ValueError(f"{name}.nproc={cfg.nproc} but the launcher started {local} processes per node "
                         f"(Elastic nproc_per_node / POSTTRAIN_SFT_NPROC); make them agree")
    if cfg.global_batch_size % (cfg.micro_batch_size * info.world_size):
        raise ValueError(f"{name}.global_batch_size={cfg.global_batch_size} must be a multiple of "
                         f"{name}.micro_batch_size * world_size = {cfg.micro_batch_size * info.world_size}")


HISTORY_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s")
"""The per-step numbers `run_sft` keeps in its history for every objective (stages.sft stores it in the model
manifest's extra), besides the objective's own `history_keys`."""


def run_sft(*, model_cfg: ModelConfig, sft_cfg: SFTConfig, tracking_cfg: TrackingConfig, dataset_dir, tokenizer_dir,
            base_model_dir, out_dir, state_dir, run_name: str = "sft", wandb_run: WandbRun | None = None,
            frozen_model_dir=None) -> dict:
    """Train on every rank; returns rank 0's last metrics and per-step history. `wandb_run` (rank 0's, from
    posttrain.tracking.wandb_run): started here - continuing the saved run id on a resume - and finished by the caller.
    The objective is `sft_cfg`'s (SFTConfig, DPOConfig, RewardModelConfig, DistillConfig); `frozen_model_dir`
    is DPO's reference or the distillation teacher (required for those two, refused for the others)."""
    # Ranks forked by Elastic inherit the parent's torch thread pool, and torch reads OMP_NUM_THREADS only
    # once: without this, N ranks x all-cores threads spin against each other (measured ~100x slower).
    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if sft_cfg.steps < 1:  # 0 steps would store the start model as if trained
        raise ValueError(f"{objective_of(sft_cfg).value}.steps={sft_cfg.steps}: a budget in tokens is turned into steps "
                         "before training (posttrain.stages.sft.with_token_budget); give run_sft the steps")
    info = init_distributed(sft_cfg.backend)
    _check_world(sft_cfg, info)
    objective = objective_for(sft_cfg)
    needs_frozen = objective.name in (Objective.DPO, Objective.DISTILL)
    if needs_frozen != (frozen_model_dir is not None):
        raise ValueError(f"{objective.name.value}: " + ("needs a frozen model (reference or teacher) folder"
                                                        if needs_frozen else "takes no frozen model"))
    torch.manual_seed(sft_cfg.seed)
    tokenizer = load_tokenizer(base_model_dir or tokenizer_dir)
    model, frozen, lora = trainee_and_frozen(objective.name, model_cfg, sft_cfg, info, tokenizer, base_model_dir,
                                             frozen_model_dir)
    pack_length = sft_cfg.pack_length or model_cfg.max_seq_len
    encoded, dropped = encode_train_split(dataset_dir, tokenizer, min(model_cfg.max_seq_len, pack_length), objective,
                                          info=info)
    optimizer = make_optimizer(model, sft_cfg)
    shards = Shards(encoded, sft_cfg, info, tokenizer.pad_token_id, pack_length)
    state = state_dir if isinstance(state_dir, StateDir) else StateDir(state_dir)
    start, wandb_id, history = load_state(state, model, optimizer, objective.name.value)
    tracker = Tracker(tracking_cfg, info.rank, run_name, total=sft_cfg.steps, start=start, wandb_run=wandb_run,
                      wandb_id=wandb_id)
    autocast = precision.uses_bf16(info.device, model_cfg.dtype)
    metrics: dict = {}
    t_start = time.perf_counter()
    for step in range(start, sft_cfg.steps):
        t0 = time.perf_counter()
        try:
            metrics = train_step(model, optimizer, shards.for_step(step), cfg=sft_cfg, info=info,
                                 lr=lr_at(step, sft_cfg), autocast=autocast, objective=objective, frozen=frozen)
        except NonFiniteError as e:
            raise NonFiniteError(f"step {step + 1}: {e}") from None
        metrics["tokens_per_s"] = metrics["tokens"] / (time.perf_counter() - t0)
        tracker.log(step, metrics)
        done = step + 1
        history.append({"step": done, **{k: metrics[k] for k in HISTORY_KEYS + objective.history_keys}})
        if (sft_cfg.save_every and done % sft_cfg.save_every == 0) or done == sft_cfg.steps:
            save_state(state, model, optimizer, done, tracker.wandb_id, info, history)
    tracker.close()
    save_final(model, model_cfg, tokenizer, base_model_dir, out_dir, info, objective.name, lora=lora)
    return {**{k: v for k, v in metrics.items()}, "steps": sft_cfg.steps, "world_size": info.world_size,
            "train_examples": len(encoded), "dropped_too_long": dropped,
            "wall_s": time.perf_counter() - t_start, "history": history}


def trainee_and_frozen(objective: Objective, model_cfg: ModelConfig, sft_cfg: SFTConfig, info: DistInfo, tokenizer,
                       base_model_dir, frozen_model_dir) -> tuple[torch.nn.Module, object, LoraConfig | None]:
    """(the trainee - with LoRA adapters when model.lora applies, wrapped for the group -, its frozen model or None,
    the LoRA settings in use). The frozen model is loaded from its folder (no gradients, no optimizer: one forward
    per micro-batch), except DPO's reference under LoRA when it is the start model: the trainee with its adapters
    off, not a second copy."""
    model = build_trainee(objective, model_cfg, tokenizer, base_model_dir)
    lora = lora_of(model_cfg, base_model_dir, info.rank, objective.value)
    if lora is not None:
        add_adapters(model.rm if isinstance(model, TokenScores) else model, lora, seed=sft_cfg.seed,
                     extra_trainable=head_of(objective))
    base_is_frozen = lora is not None and frozen_model_dir is not None and Path(frozen_model_dir) == Path(base_model_dir)
    frozen = None
    if frozen_model_dir is not None and not base_is_frozen:
        frozen = load_model(frozen_model_dir, device=info.device).requires_grad_(False)
    model = wrap(model, sft_cfg, info, gradient_checkpointing=model_cfg.gradient_checkpointing)
    if base_is_frozen:
        frozen = BaseOf(model)
        if info.rank == 0:
            print(f"{objective.value}: reference = the start model with its LoRA adapters off (no second copy)",
                  flush=True)
    return model, frozen, lora


def lora_of(model_cfg: ModelConfig, base_model_dir, rank: int, stage: str) -> LoraConfig | None:
    """model.lora when the stage starts from a model; a from-scratch model trains every weight (said once)."""
    if model_cfg.lora is not None and base_model_dir is None and rank == 0:
        print(f"{stage}: model.lora applies to the stages that start from a model; this {stage} builds one from "
              f"scratch, so every weight trains", flush=True)
    return model_cfg.lora if base_model_dir is not None else None


def head_of(objective: Objective) -> tuple[str, ...]:
    """The modules that train beside LoRA's adapters: a reward model's new score head."""
    return ("score",) if objective == Objective.REWARD_MODEL else ()


class BaseOf:
    """The trainee with its LoRA adapters switched off, called like a model: DPO's reference when it is the start
    model (objectives.py runs it under no_grad)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __call__(self, **kwargs):
        with adapters_disabled(self.model):
            return self.model(**kwargs)

    def parameters(self):
        """The trainee's (what decides the dtype its attention mask is given in: models/attention_bias.py)."""
        return self.model.parameters()


def build_trainee(objective: Objective, model_cfg: ModelConfig, tokenizer, base_model_dir):
    """The model that trains: the base folder's (or a fresh one of `model_cfg`), as a causal LM - or, for a
    reward model, with a scalar head read at every position (TokenScores)."""
    if objective == Objective.REWARD_MODEL:
        return TokenScores(build_reward_model(base_model_dir, tokenizer, model_cfg))
    return load_model(base_model_dir) if base_model_dir else build_model(model_cfg, tokenizer)


def encode_train_split(dataset_dir, tokenizer, max_len: int, objective=None,
                       info: DistInfo | None = None) -> tuple[list, int]:
    """(the sequences of every train example the objective trains on - SFT and distillation: conversations
    that end with an assistant turn; DPO and reward models: preference pairs - that fit `max_len`, how many were
    too long); refuses a split with nothing to train on. With `info` of a group of several ranks, rank r encodes
    examples r, r + world_size, ... and the group gathers them: every rank gets the same list in the split's
    order, for 1/world_size of the encoding (the calculator task's 19,500 episodes: ~20 s a rank alone). An error
    on one rank stops every rank, naming it."""
    objective = objective or SFTObjective()
    rows = [ex for ex in read_examples(dataset_dir, "train") if objective.trains_on(ex)]
    rank, world = (info.rank, info.world_size) if info is not None and info.world_size > 1 else (0, 1)
    error: Exception | None = None
    try:
        mine = [objective.encode(ex, tokenizer, max_len) for ex in rows[rank::world]]
    except Exception as e:  # noqa: BLE001 - re-raised below, after the others know
        mine, error = [], e
    note = None if error is None else f"{type(error).__name__}: {error}"
    parts = [(note, mine)]
    if world > 1:
        parts = [None] * world
        dist.all_gather_object(parts, (note, mine))
    if error is not None:
        raise error
    failed = [(r, msg) for r, (msg, _) in enumerate(parts) if msg is not None]
    if failed:
        raise ValueError(f"encoding the train split of {dataset_dir} failed on rank {failed[0][0]}: {failed[0][1]}")
    every: list = [None] * len(rows)
    for r, (_, part) in enumerate(parts):
        every[r::world] = part
    encoded = [enc for enc in every if enc is not None]
    dropped = len(every) - len(encoded)
    if not encoded:
        what = ("preference pairs (prompt, chosen, rejected: data.schema 'preference', or pairs made from a "
                "model's samples)" if objective.pairs else "conversations ending with an assistant turn")
        raise ValueError(f"no trainable examples in {dataset_dir}: {objective.name.value} needs {what} no longer "
                         f"than {max_len} tokens (model.max_seq_len / pack_length; {dropped} too long)")
    return encoded, dropped


def save_final(model, model_cfg: ModelConfig, tokenizer, base_model_dir, out_dir, info: DistInfo,
               objective: Objective = Objective.SFT, lora: LoraConfig | None = None) -> None:
    """Gather the full weights (every rank takes part) and rank 0 writes them as an HF folder: into a fresh
    model of the config, or of the base folder's architecture (a reward model: AutoModelForSequenceClassification).
    With LoRA, rank 0 writes the adapter folder (peft's layout) and the tokenizer instead; the stage names the
    base model as its parent."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if info.rank == 0 and lora is not None:
        if objective == Objective.REWARD_MODEL:
            full = {k.removeprefix("rm."): v for k, v in full.items()}
        save_adapter(full, lora, out_dir, base=str(base_model_dir), extra_trainable=head_of(objective))
        tokenizer.save_pretrained(out_dir)
    elif info.rank == 0:
        final = build_trainee(objective, model_cfg, tokenizer, base_model_dir)
        if isinstance(final, TokenScores):
            final = final.rm
            full = {k.removeprefix("rm."): v for k, v in full.items()}
        final.load_state_dict(full, strict=False)
        if "lm_head.weight" not in full and objective != Objective.REWARD_MODEL:
            final.tie_weights()
        save_model(final, tokenizer, out_dir)
    dist.barrier()
