"""Policy role, the worker side: N workers forming ONE torch.distributed group (`spmd.SPMDWorker`: the shared
training core, DDP or FSDP2) that run the same clipped policy-gradient update - SPMD - on token-balanced shards of the
batch, whatever the algorithm: one advantage per sequence (GRPO) or per token (PPO, REINFORCE++), the
token-level clipped ratio (optionally dual-clipped, `rl.clip_ratio_c`) or GSPO's sequence-level one, as the
TrainBatch says (`loss`, `loss_agg`). The controller side, which shards and gathers, is
`policy_group.PolicyGroup`.

Each rank computes its loss with `grpo.policy_loss` or `pg.gspo_loss` (normalizer = the GLOBAL tokens,
sequences or sequences x rl.max_new_tokens: `grpo.normalizer`) and scales it
by world_size because DDP averages gradients; so the all-reduced gradient is exactly the gradient of the
global-batch loss, however the batch was split. Every rank runs the same number of micro-batches (the group
computes it), otherwise DDP's all-reduce would hang. `rl.inner_epochs` passes over the batch, each split into
`rl.mini_batches` mini-batches (one optimizer step each; the group assigns rows by a seeded permutation and
gives each mini-batch its own global normalizer); after the first step the clipped importance ratio does its
work. The policy version goes up by one per update. Each rank answers with a frozen `RankUpdate`.

`PolicyGroup.update` = dispatch.shard -> .remote on every rank -> gather -> reduce stats (and check that all
ranks hold identical weights afterwards). What a rank gives the rollout side - its weights, their checksum, or
with placement.rollout_workers 0 the rollouts themselves - is `policy_weights.PolicyWeights`.

Devices: each rank computes on its own device (`local_device()`: the GPU Ray assigned it, else CPU). The
group uses NCCL only when every rank is on a GPU and no two ranks share one (NCCL refuses two ranks on one
GPU); otherwise gloo. Weights and optimizer stay fp32; with model.dtype BF16 on CUDA the forward runs under
torch.autocast(bfloat16), and the weights handed to rollout workers are rounded to bf16 (the checksum is
taken over exactly what is handed over, so a bf16 rollout engine reports the same one).
model.gradient_checkpointing recomputes activations in the update's backward pass.

Parallelism (`rl.parallelism`, the training core every trainer shares: posttrain.spmd): DDP - every rank holds
the whole model, its gradients and its AdamW moments; one rank trains the model itself, without DDP - or FSDP2:
each rank holds 1/N of the weights, gradients and moments and gathers one decoder layer at a time, so the model
RL can train is not capped by what one device holds with its gradients and moments. Both give the same
update (tests: within 1e-5). Under FSDP2 every forward is a collective: the update's micro-batches are the same in
number on every rank (as DDP needs too), and the forwards ranks run unevenly - the reference's log-probs with
LoRA, the mismatch-correction pass, generation with placement.rollout_workers 0 - run with the model gathered
once (`parallel.local_forwards`); a weight sync or checksum gathers one tensor at a time on every rank
(`parallel.FullWeights`), a saved model the full state dict onto rank 0 (as SFT's), rank 0 answering.

Memory: after every update the rank hands malloc's free pages back to the OS
(`return_free_memory`): it then rests at 1.86 GiB while the rollout generates instead of 2.3-2.7. It does
the same after every micro-batch's backward: one micro-batch's forward and backward leave ~0.45 GiB of freed
heap on a SmolLM2 LoRA rank that the next ones only partly reuse, so the heap crept to +0.6-0.7 GiB over an
update; trimmed, every micro-batch starts from the rank's rest (update peak 1.64 / 1.71 -> 1.37 / 1.46 GiB in
two steps, ~25 ms a trim; /proc RSS sampled every 5 ms in-process at 1 torch thread). A micro-batch whose freed
heap is under TRIM_AT_LEAST (128 MiB) is not trimmed: the embedded default's leave ~60 MiB, and trimming them
(and faulting the pages back in) made its update x1.38 slower (1,024 rows at 1 thread: 1.30 -> 0.94 s). Through
the pipeline
at 2 threads the LoRA step stayed x0.83-0.93 of full fine-tuning's (bench/rl_lora.py, three pairs).

Log-probs (drift check, update) are those of the sampling distribution the rollout used: temperature, then
rl.top_k / rl.top_p truncation, renormalised (posttrain.models.generate.sampling_logprobs), with the output
head applied in chunks of rows (posttrain.models.head_logprobs): no micro-batch's whole (tokens x vocabulary)
logits, log-softmax or their gradients exist at once.

Gates before the optimizer step. The drift check needs the policy's log-probs of the rollout's tokens at the
version that sampled them; the update's first forward (epoch 0, before any optimizer step) computes exactly
those, so no separate forward is run: each rank sums |policy - rollout| over its tokens, the group all-reduces
sums and counts, and every rank sees the same mean. Above `rl.drift_threshold` - or NaN - the update stops
before its optimizer step, as it does when the group's loss or the (all-reduced, so identical on every rank)
gradient norm is not finite: the weights and version stay as they were and the stats say why (`applied`
False, `stopped`). A batch generated ahead of the update (rl.max_staleness > 0) was sampled by older versions:
its drift is measured at each row's own version instead (policy_versions.KeptVersions), and a row more than
rl.max_staleness versions behind is refused.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import AutoModelForCausalLM

from posttrain.artifacts import ArtifactStore
from posttrain.config import MismatchCorrection, ModelConfig, RLConfig
from posttrain.models.head_logprobs import response_logprobs, sequence_logprobs
from posttrain.models.io import (
    compute_dtype,
    eos_token_ids,
    load_model,
    load_tokenizer,
    local_device,
    save_model,
)
from posttrain.models.lora import adapters_disabled, add_adapters, save_adapter
from posttrain.rl.algorithms import grpo, mismatch, pg
from posttrain.rl.ragged import loss_mask, pad_rows
from posttrain.rl.roles.common import set_torch_threads, where, worker_identity
from posttrain.rl.roles.policy_versions import KeptVersions
from posttrain.rl.roles.policy_weights import PolicyWeights
from posttrain.rl.roles.spmd import SPMDWorker
from posttrain.rl.types import ModelPut, PolicyLoss, PolicySums, RankUpdate, TrainBatch
from posttrain.spmd import parallel, precision
from posttrain.spmd.memory import return_free_memory

TRIM_AT_LEAST = 128 * 2**20
"""A micro-batch's freed heap is handed back to the OS only from this size (spmd.memory.return_free_memory)."""


def warmup_scale(version: int, warmup_steps: int) -> float:
    """Learning-rate factor for the update that turns policy `version` into `version + 1`: linear warm-up over
    the first `warmup_steps` updates, then 1. A function of the version alone, so a resumed run continues the
    same schedule."""
    return 1.0 if warmup_steps <= 0 else min(1.0, (version + 1) / warmup_steps)


class PolicyWorker(PolicyWeights, KeptVersions, SPMDWorker):
    role = "policy"

    def __init__(self, model_dir: str, cfg: RLConfig, rank: int, world_size: int, model_cfg: ModelConfig | None = None,
                 threads: int = 1):
        """`model_cfg` supplies dtype and gradient_checkpointing (default: ModelConfig(), fp32, off); `threads`
        torch's intra-op threads (placement.torch_threads)."""
        set_torch_threads(threads)
        self.cfg, self.rank, self.world, self.lr = cfg, rank, world_size, cfg.lr
        self.model_cfg = model_cfg or ModelConfig()
        self.id = worker_identity("policy", rank, world_size)
        torch.manual_seed(cfg.seed)
        self.device = local_device()
        self.model = load_model(model_dir, device=self.device).train()  # fp32 master weights
        self.lora = self.model_cfg.lora
        if self.lora is not None:  # only the adapters train; the base with them off is the KL reference
            add_adapters(self.model, self.lora, seed=cfg.seed)
        self.bf16 = precision.uses_bf16(self.device, self.model_cfg.dtype)
        self.sync_dtype = compute_dtype(self.model_cfg.dtype, self.device)
        """The dtype the weights are handed to rollout workers in (bf16 when they generate in bf16)."""
        self.tok = load_tokenizer(model_dir)
        self.eos_ids = eos_token_ids(model_dir, self.tok)
        self.version = 0
        self._checksum: tuple[int, str] | None = None
        """(version, checksum) the last update computed: what a sync reports when this rank generates."""
        self.net: torch.nn.Module | None = None
        """What the update's forward runs through (set when the rank joins its group, `spmd.parallel.wrap`): DDP
        around the model, the model itself (one rank), or the model sharded in place (FSDP2)."""
        self.opt: torch.optim.Optimizer | None = None
        """Built when the rank joins its group (`setup_process_group`): under FSDP2 it steps the rank's shards."""

    def where(self) -> dict:
        return where()

    def log_probs(self, prompt_ids, response_ids, temperature: float) -> tuple[list[list[float]], float]:
        """Every rank of the group calls this at once (under FSDP2 the model is gathered for it); each on its own
        rows, any number."""
        t0 = time.perf_counter()
        self.model.eval()
        with parallel.local_forwards(self.model), precision.autocast(self.bf16):
            lp = sequence_logprobs(self.model, prompt_ids, response_ids, temperature=temperature,
                                   pad_id=self.tok.pad_token_id, top_p=self.cfg.top_p, top_k=self.cfg.top_k,
                                   share_prompt=self.cfg.share_prompt)
        self.model.train()
        return [x.tolist() for x in lp], time.perf_counter() - t0

    def base_log_probs(self, prompt_ids, response_ids, temperature: float) -> tuple[list[list[float]], float]:
        """The reference's log-probs with LoRA: this rank's model with its adapters off - the start model, with
        no second copy of its weights (rl.kl_coef > 0; `PolicyBaseReference` fans the calls out)."""
        with adapters_disabled(self.model), torch.no_grad():
            return self.log_probs(prompt_ids, response_ids, temperature)

    def update(self, shard: TrainBatch | list[TrainBatch], global_tokens: int | list[int],
               global_seqs: int | list[int], n_micro: int | list[int], drift_threshold: float = math.inf
               ) -> RankUpdate:
        """One update: `rl.inner_epochs` passes over this rank's shard, one optimizer step per mini-batch per
        pass. `shard` is one TrainBatch (one mini-batch) or one per mini-batch (`rl.mini_batches`), each with
        the GLOBAL token and sequence counts of its mini-batch and its number of micro-batches (the same on
        every rank). The gates run on the first mini-batch of the first pass - the only forward at the
        batch's version - before its optimizer step."""
        self._optimizer()  # fails clearly before any work if the rank never joined its group
        shards, g_tok, g_seq, n_mic = (([shard], [global_tokens], [global_seqs], [n_micro])
                                       if isinstance(shard, TrainBatch) else (shard, global_tokens, global_seqs, n_micro))
        if any(sh.policy_version != self.version for sh in shards):
            raise RuntimeError(f"{self.id}: train batch is from policy version {shards[0].policy_version}, "
                               f"this rank holds version {self.version}")
        t0 = time.perf_counter()
        cfg = self.cfg
        versioned = None  # generated ahead (rl.max_staleness > 0): the drift gate at each row's own version
        if cfg.max_staleness > 0:
            self.check_staleness(shards)
            self.keep_version()
            versioned = self.drift_at_versions(shards, cfg.temperature)
        sums = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clip": 0.0, "ent": 0.0, "tok": 0, "mm_kl": 0.0, "mm_max": 0.0,
                "mm_tok": 0}
        grad_norm, drift = 0.0, math.nan
        trainer_old = self._trainer_old(shards, sums)
        for epoch in range(cfg.inner_epochs):
            for j, sh in enumerate(shards):
                norm = grpo.normalizer(sh.loss_agg or cfg.loss_agg, tokens=g_tok[j], sequences=g_seq[j],
                                       horizon=cfg.max_new_tokens)
                n = len(sh.response_ids)
                bounds = [round(i * n / n_mic[j]) for i in range(n_mic[j] + 1)]
                drift_sum, drift_tok = 0.0, 0.0
                for m in range(n_mic[j]):
                    out = self._backward(sh, bounds[m], bounds[m + 1], norm, sync=m == n_mic[j] - 1,
                                         trainer_old=trainer_old[j] if trainer_old else None)
                    # each micro-batch starts from the rank's rest, not the last one's heap - when that heap is
                    # worth a trim: SmolLM2's ~0.45 GiB is, the embedded default's ~60 MiB is not
                    return_free_memory(at_least=TRIM_AT_LEAST)
                    if epoch == 0:
                        d, k = self._record(sums, *out, scale=1.0 / len(shards))
                        drift_sum, drift_tok = drift_sum + d, drift_tok + k
                        if j == 0 and trainer_old is None:  # at the batch's version: the gap, measured
                            self._record_mismatch(sums, out[1].detach(), out[2], out[3])
                if epoch == 0 and j == 0:
                    drift, why = self._first_epoch_gates(sums, *(versioned or (drift_sum, drift_tok)),
                                                         drift_threshold)
                    if why:
                        return self._stopped(sums, t0, drift, why)
                grad_norm = self._clip()
                if not math.isfinite(grad_norm):
                    return self._stopped(sums, t0, drift, f"gradient norm is {grad_norm} in inner epoch {epoch}, "
                                                          f"mini-batch {j} (loss {sums['loss']:.4g} on rank "
                                                          f"{self.rank})", grad_norm=grad_norm)
                self._set_lr()
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
        self.version += 1
        return_free_memory()
        return self._answer(sums, t0, drift, grad_norm, applied=True, stopped="")

    def _trainer_old(self, shards: list[TrainBatch], sums: dict) -> list[list[list[float]]] | None:
        """The trainer's own log-probs at the batch's version for rl.mismatch_correction, with their gap recorded
        in `sums`: a no-grad forward over every shard before any optimizer step when there are several passes or
        mini-batches; None when the update's first forward gives them (one pass over one mini-batch) or no
        correction is asked for."""
        cfg = self.cfg
        if cfg.mismatch_correction == MismatchCorrection.OFF or (cfg.inner_epochs == 1 and len(shards) == 1):
            return None
        trainer_old = [self.log_probs(sh.prompt_ids, sh.response_ids, cfg.temperature)[0] for sh in shards]
        for sh, rows in zip(shards, trainer_old):
            shape = (len(rows), max((len(r) for r in rows), default=0))
            mask = loss_mask(sh, 0, len(rows), shape)
            self._record_mismatch(sums, pad_rows(rows, shape), pad_rows(sh.old_logprobs, shape), mask)
        return trainer_old

    def _backward(self, shard: TrainBatch, lo: int, hi: int, norm: float, sync: bool,
                  trainer_old: list[list[float]] | None = None) -> tuple:
        """Forward, policy loss and backward of rows lo:hi of the shard; DDP all-reduces the gradients only when
        `sync` (the last micro-batch). With rl.mismatch_correction the ratio's old log-probs are the trainer's at
        the batch's version (`trainer_old` rows, else this forward's own: one pass over one mini-batch) and each
        token's policy term carries its truncated importance weight. Returns (entropies, log-probs, rollout
        log-probs, mask, loss, loss stats)."""
        cfg = self.cfg
        with parallel.grad_sync(self.net, last=sync):
            with precision.autocast(self.bf16):  # (b, R) fp32, the output head in chunks (models.head_logprobs)
                logp, ent, mask = response_logprobs(self.net, shard.prompt_ids[lo:hi], shard.response_ids[lo:hi],
                                                    self.tok.pad_token_id, temperature=cfg.temperature,
                                                    top_p=cfg.top_p, top_k=cfg.top_k, share_prompt=cfg.share_prompt)
            if shard.sampled is not None:  # an episode's environment tokens: context, never trained on
                mask = mask & loss_mask(shard, lo, hi, mask.shape).to(mask.device)
            old = pad_rows(shard.old_logprobs[lo:hi], logp.shape).to(self.device)
            ref = pad_rows(shard.ref_logprobs[lo:hi], logp.shape).to(self.device) if shard.ref_logprobs else None
            rows = shard.advantages[lo:hi]
            adv = (pad_rows(rows, logp.shape) if rows and isinstance(rows[0], list)  # (b, R) per token (PPO)
                   else torch.tensor(rows, dtype=torch.float32)).to(self.device)  # (b,) per sequence (GRPO)
            kw = {"clip_low": cfg.clip_low, "clip_high": cfg.clip_high, "loss_agg": shard.loss_agg or cfg.loss_agg,
                  "ref_logp": ref, "kl_coef": cfg.kl_coef, "kl_estimator": cfg.kl_estimator, "normalizer": norm}
            ratio_old = old
            if cfg.mismatch_correction != MismatchCorrection.OFF:
                ratio_old = (pad_rows(trainer_old[lo:hi], logp.shape).to(self.device) if trainer_old is not None
                             else logp.detach())
                kw["weights"] = mismatch.mismatch_weights(ratio_old, old, mask, mode=cfg.mismatch_correction,
                                                          cap=cfg.mismatch_cap)
            if shard.loss == PolicyLoss.GSPO:
                loss, st = pg.gspo_loss(logp, ratio_old, adv, mask, **kw)
            else:
                loss, st = grpo.policy_loss(logp, ratio_old, adv, mask, clip_ratio_c=cfg.clip_ratio_c or None, **kw)
            (loss * self.world).backward()
        return ent, logp, old, mask, loss, st

    def _record(self, sums: dict, ent, logp, old, mask, loss, st, *, scale: float = 1.0) -> tuple[float, float]:
        """Add a first-epoch micro-batch's loss statistics and entropy to `sums`; return its drift sum
        (|policy - rollout| log-prob over its tokens) and token count."""
        with torch.no_grad():
            drift = float(((logp.detach() - old).abs() * mask).sum())
        k = st.tokens
        sums["loss"] += float(loss.detach()) * scale  # mini-batches: the mean of their losses
        sums["pg"] += st.pg_loss * k
        sums["kl"] += st.kl * k
        sums["clip"] += st.clip_fraction * k
        sums["ent"] += float((ent * mask).sum())
        sums["tok"] += k
        return drift, float(mask.sum())

    @staticmethod
    def _record_mismatch(sums: dict, trainer_logp, rollout_logp, mask) -> None:
        k3, mx, n = mismatch.mismatch_stats(trainer_logp, rollout_logp, mask)
        sums["mm_kl"] += k3
        sums["mm_tok"] += n
        sums["mm_max"] = max(sums["mm_max"], mx)

    def _first_epoch_gates(self, sums: dict, drift_sum: float, drift_tok: float, threshold: float
                           ) -> tuple[float, str]:
        """(the group's mean drift, why the update must stop - "" when it may go on). Every rank computes the
        same answer: drift and loss are all-reduced over the group."""
        drift = self._group_mean(drift_sum, drift_tok)
        if not drift <= threshold:  # NaN fails too
            return drift, f"drift {drift:.4g} > rl.drift_threshold {threshold:g}"
        group_loss = self._group_mean(sums["loss"], 1.0)  # a non-finite loss on any rank stops every rank
        if not math.isfinite(group_loss):  # (later epochs: their gradient norm is the gate)
            return drift, f"loss is {group_loss} (policy group; rank {self.rank}'s {sums['loss']:.4g})"
        return drift, ""

    def _stopped(self, sums: dict, t0: float, drift: float, why: str, grad_norm: float = 0.0) -> RankUpdate:
        """The update's answer when a gate stopped it before the optimizer step: nothing changed."""
        self.opt.zero_grad(set_to_none=True)
        return_free_memory()
        return self._answer(sums, t0, drift, grad_norm, applied=False, stopped=why)

    def _answer(self, sums: dict, t0: float, drift: float, grad_norm: float, *, applied: bool,
                stopped: str) -> RankUpdate:
        return RankUpdate(loss=sums["loss"], sums=PolicySums(pg=sums["pg"], kl=sums["kl"], clip=sums["clip"],
                                                             entropy=sums["ent"], mismatch_kl=sums["mm_kl"],
                                                             mismatch_max=sums["mm_max"],
                                                             mismatch_tokens=float(sums["mm_tok"])),
                          tokens=int(sums["tok"]), grad_norm=grad_norm, version=self.version,
                          checksum=self._remember_checksum(), applied=applied, stopped=stopped,
                          compute_s=time.perf_counter() - t0, drift=drift)

    def _set_lr(self) -> None:
        """rl.lr times the warm-up factor of the current version. From the config, never from the optimizer's
        param groups: a resumed optimizer holds only the keys a fresh one has (DCP loads into the target's keys),
        so a base rate kept there came back as the last scaled rate."""
        lr = self.lr * warmup_scale(self.version, self.cfg.warmup_steps)
        for g in self.opt.param_groups:
            g["lr"] = lr

    def save_model(self, put: ModelPut) -> str | None:
        """Rank 0: the HF checkpoint of the current weights, stored as a `model` artifact (see PolicyGroup). Every
        rank calls it: under FSDP2 every rank takes part in gathering the full state dict onto rank 0 (CPU)."""
        sharded = parallel.is_sharded(self.model)
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
                                    ) if sharded else None  # as sft.trainer.save_final: rank 0 holds it
        if self.rank != 0:
            return None
        with tempfile.TemporaryDirectory(prefix="posttrain-rl-checkpoint-") as tmp:
            if self.lora is not None:  # an adapter artifact: its base (put.extra's adapter_of) is the start model
                base = put.extra.get("adapter_of")
                if not base or base not in put.parents:
                    raise ValueError(f"{self.id}: a LoRA checkpoint needs its base model's id in extra.adapter_of "
                                     f"and among its parents (got {base!r})")
                save_adapter(full if sharded else self.model.state_dict(), self.lora, tmp, base=f"posttrain:{base}")
                self.tok.save_pretrained(tmp)
            else:
                save_model(_unsharded_copy(self.model, full) if sharded else self.model, self.tok, tmp)
            (Path(tmp) / "posttrain_rl.json").write_text(json.dumps(put.provenance, sort_keys=True) + "\n")
            ref = ArtifactStore(put.store_root).put("model", put.name, tmp, run_id=put.run_id, parents=put.parents,
                                                    config=put.config, metrics=put.metrics, extra=put.extra)
        return ref.id


def _unsharded_copy(model: torch.nn.Module, full: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A plain (unsharded, CPU) model of `model`'s architecture holding `full`: what an HF folder is written from."""
    copy = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    copy.load_state_dict(full, strict=False)
    copy.tie_weights()
    return copy
