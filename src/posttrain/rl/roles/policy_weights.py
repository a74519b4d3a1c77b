"""What the policy rank gives the rollout side: its weights for rollout workers (a shared-memory file, or CPU
copies for Ray's object store), their checksum, and - with `placement.rollout_workers` 0 - the rollouts
themselves, sampled from its own model (rollout.PolicyRollout).

`PolicyWeights` is a part of `policy.PolicyWorker` (a mixin), kept apart from the update: it reads the worker's
`model`, `lora`, `sync_dtype`, `version`, `id`, `rank`, `tok`, `eos_ids` and `bf16`, and keeps
`_checksum`, the (version, checksum) the last update computed.

With LoRA the rollout side gets the base with the adapters merged in (lora.MergedView), computed one tensor at
a time as it is written or hashed - never a second full copy.

Under `rl.parallelism` FSDP2 each rank holds a shard of every weight: the full weights are gathered one tensor at
a time (`spmd.parallel.FullWeights`), a collective, so every rank of the group takes part in `state_dict`,
`publish` and `checksum` (the group calls them on all ranks; rank 0 answers, the others gather and drop). Under
DDP every rank holds them whole and only rank 0 does the work; the others answer None at once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from posttrain.models.generate import generate
from posttrain.models.lora import MergedView
from posttrain.rl import weight_transfer
from posttrain.rl.roles.rollout import trajectories
from posttrain.rl.types import PromptBatch, Trajectories, WeightReport
from posttrain.rl.weight_sync import weights_checksum
from posttrain.spmd import parallel, precision
from posttrain.spmd.memory import return_free_memory


class PolicyWeights:
    def _rollout_weights(self) -> Mapping[str, torch.Tensor]:
        """What rollout workers get, under the base architecture's names: the weights, or with LoRA the base with
        the adapters merged in (W + B @ A * alpha / rank; the rollout model has no adapters), each merged weight
        computed when it is read (lora.MergedView: no second full copy while it is written or hashed)."""
        sd = parallel.FullWeights(self.model)
        return MergedView(sd, self.lora) if self.lora is not None else sd

    def _helps_only(self) -> bool:
        """This rank takes part in a weight hand-over without answering: under FSDP2, the ranks other than 0."""
        return self.rank != 0 and parallel.is_sharded(self.model)

    def _idle(self) -> bool:
        """This rank has nothing to do in a weight hand-over: under DDP, the ranks other than 0."""
        return self.rank != 0 and not parallel.is_sharded(self.model)

    def load_state(self, state_dir: str) -> int:
        self._checksum = None  # the loaded weights are not the ones last hashed
        return super().load_state(state_dir)

    def _remember_checksum(self) -> str:
        self._checksum = (self.version, self.checksum())
        return self._checksum[1]

    # -- generation by the policy ranks themselves (placement.rollout_workers 0: rollout.PolicyRollout)

    def generate(self, prompts: PromptBatch, n: int, temperature: float, max_new_tokens: int, seed: int,
                 top_p: float = 1.0, top_k: int = 0) -> Trajectories:
        """What a rollout worker's `generate` returns, sampled from this rank's own model (adapters applied) in
        eval mode without gradients; the seed is offset by the rank as a rollout worker's is."""
        if prompts.policy_version != self.version:
            raise RuntimeError(f"{self.id} holds policy version {self.version}, asked to generate with "
                               f"{prompts.policy_version}")
        t0 = time.perf_counter()
        self.model.eval()
        try:  # ranks stop generating at different steps: under FSDP2 the model is gathered once for all of them
            with parallel.local_forwards(self.model), precision.autocast(self.bf16), torch.no_grad():
                gens = generate(self.model, prompts.prompt_ids, max_new_tokens=max_new_tokens,
                                temperature=temperature, n=n, eos_id=self.eos_ids, pad_id=self.tok.pad_token_id,
                                seed=seed + 7919 * self.rank, batch_size=self.cfg.policy_generate_batch or 512,
                                top_p=top_p, top_k=top_k)
        finally:
            self.model.train()
        return_free_memory()  # the KV cache's pages back to the OS before the update allocates its own
        return trajectories(gens, prompts, n, self.tok, self.version, time.perf_counter() - t0)

    def load_weights(self, payload: None, version: int) -> WeightReport:
        """The weight sync when this rank generates itself: nothing travels. Confirms it holds `version` and
        reports the checksum its last update computed over the weights it generates with (or computes it)."""
        if payload is not None:
            raise RuntimeError(f"{self.id} generates with its own weights and takes none (got {type(payload)})")
        if version != self.version:
            raise RuntimeError(f"{self.id} holds policy version {self.version}, not {version}")
        known = self._checksum
        checksum = known[1] if known and known[0] == self.version else self._remember_checksum()
        return WeightReport(worker=self.id, version=self.version, checksum=checksum)

    def checksum(self) -> str:
        """Checksum of exactly what `state_dict()` hands to rollout workers (in `sync_dtype`)."""
        return weights_checksum(_Cast(self._rollout_weights(), self.sync_dtype))

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """The weights for rollout workers: CPU copies in `sync_dtype` (Ray ships CPU tensors); rank 0 answers
        (under FSDP2 every rank gathers them with it)."""
        if self._idle():
            return None
        named = self._rollout_weights()
        if self._helps_only():
            _read_along(named, list(named))
            return None
        return {k: v.detach().to("cpu", self.sync_dtype, copy=True) for k, v in named.items()}

    def choose_shared_folder(self, preferred: str) -> tuple[str | None, str]:
        """Where this node has room for the weight file (`weight_transfer.choose_folder`): (folder or None for
        the object store, why)."""
        if self.rank != 0:
            return None, "rank 0 writes the weight file"
        named = self._rollout_weights()  # sizes only: nothing is gathered
        folder, why = weight_transfer.choose_folder(preferred, weight_transfer.file_bytes(named, self.sync_dtype))
        self._shared_folders = [preferred] + ([str(folder)] if folder else [])
        return (str(folder) if folder else None), why

    def remove_shared(self) -> None:
        """Remove the weight-file folders on this node (the run's actors are being released)."""
        for folder in getattr(self, "_shared_folders", []):
            weight_transfer.remove_folder(folder)

    def publish(self, folder: str) -> weight_transfer.SharedWeights | None:
        """Write the weights for rollout workers on this node into shared memory (`weight_transfer`), in
        `sync_dtype`, streamed tensor by tensor: no second full copy in this process. Rank 0 writes; under FSDP2
        the others gather each tensor with it, in the order it is written."""
        if self._idle():
            return None
        if self._helps_only():
            named = self._rollout_weights()
            _read_along(named, weight_transfer.write_order(named))
            return None
        return weight_transfer.write(self._rollout_weights(), folder, version=self.version, node=self.id.node,
                                     dtype=self.sync_dtype, keep=max(self.cfg.max_staleness - 1, 0))


def _read_along(named: Mapping[str, torch.Tensor], names: list[str]) -> None:
    """Read `names` of `named` in order and drop each at once: a rank that only helps gather an FSDP2 model's
    tensors while rank 0 reads the same names in the same order."""
    for name in names:
        named[name]


class _Cast(Mapping):
    """`named` with each tensor cast to `dtype` when it is read: hashing streams one tensor at a time, so a
    LoRA policy's merged weights (lora.MergedView) never all exist at once (all of them at once were a second
    copy of every adapted weight at the end of each update)."""

    def __init__(self, named: Mapping[str, torch.Tensor], dtype: torch.dtype):
        self.named, self.dtype = named, dtype

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.named[name].detach().to(self.dtype)

    def __iter__(self):
        return iter(self.named)

    def __len__(self) -> int:
        return len(self.named)

