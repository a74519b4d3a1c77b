"""Critic role (PPO), the worker side: a value head on the policy's architecture - an
`AutoModelForSequenceClassification` with one output, read at every position (`models.reward_model.TokenScores`)
- trained SPMD like the policy (`spmd.SPMDWorker`: one torch.distributed group on the shared training core, DDP or
FSDP2 as `rl.parallelism` says, AdamW with its own `rl.critic_lr`, its state checkpointed and restored with the
policy's).

Where it starts (`rl.critic_init`): "" = the policy's start model's body with a fresh scalar head, initialised
under `torch.manual_seed(rl.seed)` so every rank (and every restart) builds the same one; or a folder holding
a sequence classifier with one output, e.g. a trained reward model, head included.

Alignment: the value of response token t is the head's output at the position that predicts it (the last
prompt token for t = 0), exactly where the policy's logits for t are read (`forward_response_logits`' layout:
prompts left-padded to one column, responses right-padded), as verl's critic reads `values[:, -R-1:-1]`.

Update: `rl.inner_epochs` passes, `rl.mini_batches` optimizer steps per pass, the clipped value loss
(`ppo.value_loss`) token-mean over each mini-batch's GLOBAL valid tokens; stopped before its optimizer step
when the group's loss or the gradient norm is not finite (`applied` False, weights unchanged).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch

from posttrain.config import ModelConfig, RLConfig
from posttrain.models.io import load_tokenizer, local_device
from posttrain.models.lora import add_adapters
from posttrain.models.reward_model import TokenScores, build_reward_model
from posttrain.rl.algorithms import ppo
from posttrain.rl.ragged import loss_mask, pad_rows
from posttrain.rl.roles.common import set_torch_threads, where, worker_identity
from posttrain.rl.roles.spmd import SPMDWorker
from posttrain.rl.types import CriticSums, RankUpdate
from posttrain.rl.weight_sync import weights_checksum
from posttrain.spmd import parallel, precision
from posttrain.spmd.memory import return_free_memory


@dataclass(frozen=True, kw_only=True)
class Values:
    policy_version: int
    """Version of the trajectories they were computed for."""
    values: list[list[float]]
    """(B, response_len_i) the critic's value of each response token's state."""
    compute_s: float


@dataclass(frozen=True, kw_only=True)
class CriticBatch:
    policy_version: int
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    old_values: list[list[float]]
    """(B, response_len_i) the values the advantages were computed with (the clipped loss's centre)."""
    returns: list[list[float]]
    """(B, response_len_i) GAE returns: the regression targets."""
    sampled: list[list[int]] | None = None
    """(B, response_len_i) Trajectories.sampled: the value loss is over the policy's tokens only (None: all)."""


@dataclass(frozen=True, kw_only=True)
class CriticFit:
    """What the one-pass critic call (`CriticWorker.fit`) needs: the samples and their token rewards; the values
    and returns are computed inside, from the same forward that trains."""

    policy_version: int
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    token_rewards: list[list[float]]
    """(B, response_len_i) outcome on the last token (minus the KL penalty when it is in the reward)."""
    gamma: float
    lam: float
    sampled: list[list[int]] | None = None
    """(B, response_len_i) Trajectories.sampled: GAE steps over the environment's tokens and the value loss
    leaves them out (None: every token is the policy's)."""


@dataclass(frozen=True, kw_only=True)
class CriticStats:
    value_loss: float
    """Token mean of the clipped value loss over the first pass (before whitening nothing: raw returns)."""
    clip_fraction: float
    """Share of tokens where the clipped term was the larger."""
    values_mean: float
    grad_norm: float
    version: int
    """Critic updates done (after this one)."""
    weights_checksum: str
    compute_s: float
    applied: bool = True
    stopped: str = ""


def response_values(net, prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (B, R), mask (B, R)): the head's output at the positions that predict each response token, in
    `forward_response_logits`' layout (so value t and log-prob t belong to the same state)."""
    device = next(net.parameters()).device
    B, P = len(prompt_ids), max(len(p) for p in prompt_ids)
    R = max(max(len(r) for r in response_ids), 1)
    ids = torch.full((B, P + R - 1), pad_id, dtype=torch.long)
    att = torch.zeros((B, P + R - 1), dtype=torch.long)
    mask = torch.zeros((B, R), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        seq = (p + r)[: len(p) + R - 1]
        ids[i, P - len(p): P - len(p) + len(seq)] = torch.tensor(seq)
        att[i, P - len(p): P - len(p) + len(seq)] = 1
        mask[i, :len(r)] = True
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    scores = net(input_ids=ids.to(device), position_ids=pos.to(device), attention_mask=att.to(device))  # (B, P+R-1)
    return scores[:, -R:].float(), mask.to(device)


class CriticWorker(SPMDWorker):
    role = "critic"

    def __init__(self, init_dir: str, cfg: RLConfig, rank: int, world_size: int, model_cfg: ModelConfig | None = None,
                 threads: int = 1):
        set_torch_threads(threads)
        self.cfg, self.rank, self.world, self.lr = cfg, rank, world_size, cfg.critic_lr
        self.model_cfg = model_cfg or ModelConfig()
        self.id = worker_identity("critic", rank, world_size)
        self.device = local_device()
        self.tok = load_tokenizer(init_dir)
        torch.manual_seed(cfg.seed)  # the fresh head: the same on every rank and after a restart
        rm = build_reward_model(init_dir, self.tok)
        if self.model_cfg.lora is not None:  # adapters and the value head train; the body stays frozen
            add_adapters(rm, self.model_cfg.lora, seed=cfg.seed, extra_trainable=("score",))
        self.model = TokenScores(rm).to(self.device).train()  # fp32 master weights
        self.bf16 = precision.uses_bf16(self.device, self.model_cfg.dtype)
        self.version = 0
        self.net: torch.nn.Module | None = None
        self.opt: torch.optim.Optimizer | None = None

    def where(self) -> dict:
        return where()

    @torch.no_grad()
    def values(self, prompt_ids, response_ids) -> tuple[list[list[float]], float]:
        """Every rank at once, each on its own rows (under FSDP2 the model is gathered for them)."""
        t0 = time.perf_counter()
        self.model.eval()
        out = []
        mb = self.cfg.micro_batch_size
        with parallel.local_forwards(self.model):
            for lo in range(0, len(prompt_ids), mb):
                with precision.autocast(self.bf16):
                    v, _ = response_values(self.model, prompt_ids[lo:lo + mb], response_ids[lo:lo + mb],
                                           self.tok.pad_token_id)
                out += [row[:len(r)].tolist() for row, r in zip(v.cpu(), response_ids[lo:lo + mb])]
        self.model.train()
        return out, time.perf_counter() - t0

    def checksum(self) -> str:
        """Every rank at once (under FSDP2 the weights are gathered one tensor at a time)."""
        return weights_checksum(parallel.FullWeights(self.model))

    def update(self, shards: list[CriticBatch], global_tokens: list[int], n_micro: list[int]) -> RankUpdate:
        """`rl.inner_epochs` passes over this rank's shards (one per mini-batch), one optimizer step each."""
        self._optimizer()
        t0, cfg = time.perf_counter(), self.cfg
        sums = {"loss": 0.0, "clip": 0.0, "vmean": 0.0, "tok": 0}
        grad_norm = 0.0
        for epoch in range(cfg.inner_epochs):
            for j, sh in enumerate(shards):
                n = len(sh.response_ids)
                bounds = [round(i * n / n_micro[j]) for i in range(n_micro[j] + 1)]
                for m in range(n_micro[j]):
                    st = self._backward(sh, bounds[m], bounds[m + 1], float(global_tokens[j]),
                                        sync=m == n_micro[j] - 1)
                    if epoch == 0:
                        sums["loss"] += st.vf_loss * st.tokens
                        sums["clip"] += st.clip_fraction * st.tokens
                        sums["vmean"] += st.values_mean * st.tokens
                        sums["tok"] += st.tokens
                if epoch == 0 and j == 0:
                    group_loss = self._group_mean(sums["loss"], float(sums["tok"]))
                    if not math.isfinite(group_loss):  # any rank's non-finite loss stops every rank
                        return self._stopped(sums, t0, f"value loss is {group_loss} (critic group)")
                grad_norm = self._clip()
                if not math.isfinite(grad_norm):
                    return self._stopped(sums, t0, f"critic gradient norm is {grad_norm} in inner epoch {epoch}, "
                                                   f"mini-batch {j}", grad_norm)
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
        self.version += 1
        return_free_memory()
        return self._answer(sums, t0, grad_norm, applied=True, stopped="")

    def one_pass(self) -> bool:
        """Whether `fit` gives exactly the two-call result here: no dropout anywhere (the values of a training
        forward are those of an eval one)."""
        cfg = self.model.rm.config
        return (not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in self.model.modules())
                and not getattr(cfg, "attention_dropout", 0.0))

    def fit(self, sh: CriticFit, global_tokens: int, n_micro: int) -> RankUpdate:
        """`values` and `update` in ONE forward per micro-batch, for one pass over one mini-batch (rl.inner_epochs
        and rl.mini_batches 1): each micro-batch's forward gives the values at the critic's current version - the
        advantages' baseline, returned in shard order - its rows' GAE returns (a per-row recursion) and, with
        old values = those same values (so the clip is inactive, as in the first pass of `update`), the value
        loss to back-propagate; one optimizer step at the end. The same numbers as values() then update(),
        without the separate no-grad forward."""
        self._optimizer()
        t0, cfg = time.perf_counter(), self.cfg
        sums = {"loss": 0.0, "clip": 0.0, "vmean": 0.0, "tok": 0}
        values: list[list[float]] = []
        n = len(sh.response_ids)
        bounds = [round(i * n / n_micro) for i in range(n_micro + 1)]
        for m in range(n_micro):
            lo, hi = bounds[m], bounds[m + 1]
            with parallel.grad_sync(self.net, last=m == n_micro - 1):
                with precision.autocast(self.bf16):
                    v, mask = response_values(self.net, sh.prompt_ids[lo:hi], sh.response_ids[lo:hi],
                                              self.tok.pad_token_id)
                if sh.sampled is not None:  # an episode's environment tokens: no loss, no GAE step
                    mask = mask & loss_mask(sh, lo, hi, mask.shape).to(mask.device)
                old = v.detach()
                ret = ppo.gae_returns(pad_rows(sh.token_rewards[lo:hi], v.shape).to(self.device), old, mask,
                                      gamma=sh.gamma, lam=sh.lam)
                loss, st = ppo.value_loss(v, old, ret, mask, clip_range=cfg.value_clip,
                                          normalizer=float(global_tokens))
                (loss * self.world).backward()
            values += [row[:len(r)].tolist() for row, r in zip(old.cpu(), sh.response_ids[lo:hi])]
            sums["loss"] += st.vf_loss * st.tokens
            sums["clip"] += st.clip_fraction * st.tokens
            sums["vmean"] += st.values_mean * st.tokens
            sums["tok"] += st.tokens
        return dataclasses.replace(self._step(sums, t0), values=values)

    def _step(self, sums: dict, t0: float) -> RankUpdate:
        """The gates and the optimizer step after a pass whose gradients are accumulated."""
        group_loss = self._group_mean(sums["loss"], float(sums["tok"]))
        if not math.isfinite(group_loss):
            return self._stopped(sums, t0, f"value loss is {group_loss} (critic group)")
        grad_norm = self._clip()
        if not math.isfinite(grad_norm):
            return self._stopped(sums, t0, f"critic gradient norm is {grad_norm}", grad_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.version += 1
        return_free_memory()
        return self._answer(sums, t0, grad_norm, applied=True, stopped="")

    def _backward(self, sh: CriticBatch, lo: int, hi: int, norm: float, sync: bool) -> ppo.ValueLossStats:
        with parallel.grad_sync(self.net, last=sync):
            with precision.autocast(self.bf16):
                v, mask = response_values(self.net, sh.prompt_ids[lo:hi], sh.response_ids[lo:hi],
                                          self.tok.pad_token_id)
            if sh.sampled is not None:
                mask = mask & loss_mask(sh, lo, hi, mask.shape).to(mask.device)
            old = pad_rows(sh.old_values[lo:hi], v.shape).to(self.device)
            ret = pad_rows(sh.returns[lo:hi], v.shape).to(self.device)
            loss, st = ppo.value_loss(v, old, ret, mask, clip_range=self.cfg.value_clip, normalizer=norm)
            (loss * self.world).backward()  # DDP averages gradients; the normalizer is global
        return st

    def _stopped(self, sums: dict, t0: float, why: str, grad_norm: float = 0.0) -> RankUpdate:
        self.opt.zero_grad(set_to_none=True)
        return_free_memory()
        return self._answer(sums, t0, grad_norm, applied=False, stopped=why)

    def _answer(self, sums: dict, t0: float, grad_norm: float, *, applied: bool, stopped: str) -> RankUpdate:
        return RankUpdate(loss=sums["loss"], sums=CriticSums(clip=float(sums["clip"]), values=float(sums["vmean"])),
                          tokens=int(sums["tok"]), grad_norm=grad_norm, version=self.version, checksum=self.checksum(),
                          applied=applied, stopped=stopped, compute_s=time.perf_counter() - t0)
