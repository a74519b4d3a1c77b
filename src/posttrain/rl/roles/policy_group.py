"""Policy role, the controller side: `PolicyGroup` drives the SPMD policy workers (`policy.PolicyWorker`) -
forms their torch.distributed group, shards each TrainBatch by tokens, gathers and reduces the ranks' stats
(checking that all ranks hold identical weights afterwards), hands the weights to weight sync, and fans
checkpoint calls out. Every remote wait is bounded by the group's timeout and names the stage and worker.

Rows without a gradient are not sent (`rows_with_gradient`): with no KL term in the loss (the TrainBatch has no
reference log-probs), a row whose advantages are all exactly 0 adds exactly 0 to the loss and to every gradient -
whatever its ratio, clip, dual-clip or mismatch weight - so the update runs only the other rows through the model,
with the normaliser of the WHOLE batch (its tokens, its sequences): the same update, within float rounding, for
less compute. On a hard task most GRPO groups have all-equal rewards (all 0) and so all-zero advantages: on
SmolLM2 with chain_sum most of the batch. The update's entropy, clip fraction and drift are then over the rows it
trained on; `update/skipped_rows` in the step's metrics counts the others.
"""

from __future__ import annotations

import math

import torch

from posttrain.rl import dispatch
from posttrain.rl.ragged import take_rows, trained_tokens
from posttrain.rl.remote import gather
from posttrain.rl.roles.spmd import SPMDGroup
from posttrain.rl.types import ModelPut, PolicySums, TrainBatch, UpdateStats, WeightsHandle, WorkerId


class PolicyGroup(SPMDGroup):
    role = "policy"

    def __init__(self, workers: list, ids: list[WorkerId], timeout_s: float, micro_batch_size: int,
                 shared_folder: str | None = None, mini_batches: int = 1, seed: int = 0, generates: bool = False):
        """`shared_folder`: hand weights over through a file there (every rollout worker must be on rank 0's
        node: see `weight_transfer`); None: through Ray's object store. `generates`: the ranks generate the
        rollouts themselves (placement.rollout_workers 0, rollout.PolicyRollout), so no weights are handed over.
        `mini_batches`: optimizer steps per pass
        over a batch (rl.mini_batches); rows go to mini-batches by a permutation seeded with `seed` and the
        version, so a resumed run splits the same way."""
        super().__init__(workers, ids, timeout_s)
        self.mb, self.mini_batches, self.seed = micro_batch_size, mini_batches, seed
        self.generates = generates
        self.shared_folder = None
        self.transport = "Ray's object store (no folder on policy rank 0's node that the rollout workers share)"
        if generates:
            self.transport = "none: the policy ranks generate (placement.rollout_workers 0)"
        elif shared_folder:  # is there room on rank 0's node? (a pod's /dev/shm may be 64 MiB)
            self.shared_folder, self.transport = gather([workers[0].choose_shared_folder.remote(shared_folder)],
                                                        ids[:1], stage="policy.weights", timeout_s=timeout_s)[0]
        print("rl: the policy ranks generate the rollouts with their own weights (placement.rollout_workers 0): "
              "no weight transfer" if generates else f"rl: weights reach the rollout workers through {self.transport}",
              flush=True)
        self.version = 0
        self._checksum: str | None = None
        """Checksum of the weights at `version`, as rank 0 reported it after the last update (None: not known
        yet - before the first update or after load_state)."""

    def update(self, batch: TrainBatch, *, drift_threshold: float = math.inf) -> UpdateStats:
        """One SPMD update; stopped before its optimizer step (`applied` False, nothing changed) when the
        drift between the batch's rollout log-probs and the policy's own is above `drift_threshold` (or NaN),
        or the gradient norm is not finite."""
        if self.mini_batches == 1:
            shards, counts = self._shard(batch, list(range(len(batch.response_ids))))
            sent = sum(len(sh.response_ids) for sh in shards)
            refs = [w.update.remote(sh, *counts, drift_threshold) for w, sh in zip(self.workers, shards)]
        else:
            per_mb = [self._shard(batch, rows) for rows in mini_batch_rows(len(batch.response_ids),
                                                                           self.mini_batches,
                                                                           seed=self.seed + batch.policy_version)]
            sent = sum(len(sh.response_ids) for mb in per_mb for sh in mb[0])
            refs = [w.update.remote([mb[0][k] for mb in per_mb], *[[mb[1][c] for mb in per_mb] for c in range(3)],
                                    drift_threshold) for k, w in enumerate(self.workers)]
        res = gather(refs, self.ids, stage="policy.update", timeout_s=self.timeout_s)
        if len({r.checksum for r in res}) != 1:
            raise RuntimeError("stage policy.update: policy ranks hold different weights after the update: " +
                               ", ".join(f"{w}={r.checksum[:12]}" for w, r in zip(self.ids, res)))
        tok = max(1, sum(r.tokens for r in res))
        sums: list[PolicySums] = [r.sums for r in res]
        first = res[0]
        self.version, self._checksum = first.version, first.checksum
        mm_tok = sum(s.mismatch_tokens for s in sums)
        return UpdateStats(policy_version=self.version, loss=sum(r.loss for r in res),
                           pg_loss=sum(s.pg for s in sums) / tok, kl=sum(s.kl for s in sums) / tok,
                           entropy=sum(s.entropy for s in sums) / tok, clip_fraction=sum(s.clip for s in sums) / tok,
                           grad_norm=first.grad_norm, weights_checksum=first.checksum, drift=first.drift,
                           applied=first.applied, stopped=first.stopped, compute_s=max(r.compute_s for r in res),
                           mismatch_kl=sum(s.mismatch_kl for s in sums) / max(mm_tok, 1.0),
                           mismatch_max=max(s.mismatch_max for s in sums),
                           skipped_rows=len(batch.response_ids) - sent)

    def weights(self) -> WeightsHandle:
        """The weights for rollout workers. Their checksum is the one the update reported (hashing the weights
        again would only repeat it); each rollout worker then checks what it received against it. Every rank is
        called: under FSDP2 the ranks gather the weights together; rank 0 answers."""
        if self._checksum is None:
            self._checksum = self._rank0([w.checksum.remote() for w in self.workers])
        if self.generates:
            payload = None
        elif self.shared_folder:
            payload = self._rank0([w.publish.remote(self.shared_folder) for w in self.workers])
        else:  # rank 0's answer stays a reference: rollout workers fetch it themselves
            refs = [w.state_dict.remote() for w in self.workers]
            gather(refs[1:], self.ids[1:], stage="policy.weights", timeout_s=self.timeout_s)
            payload = refs[0]
        return WeightsHandle(version=self.version, checksum=self._checksum, payload=payload)

    def _rank0(self, refs: list):
        """Rank 0's answer to a call made on every rank (the others help gather under FSDP2, or return at once)."""
        return gather(refs, self.ids, stage="policy.weights", timeout_s=self.timeout_s)[0]

    def save_model(self, put: ModelPut) -> str:
        ids = gather([w.save_model.remote(put) for w in self.workers], self.ids, stage="policy.save_model",
                     timeout_s=self.timeout_s)
        return ids[0]

    def load_state(self, state_dir: str) -> int:
        self.version, self._checksum = super().load_state(state_dir), None
        return self.version

    def _shard(self, batch: TrainBatch, rows: list[int]) -> tuple[list[TrainBatch], tuple[int, int, int]]:
        """Rows `rows` of the batch - those with a gradient (`rows_with_gradient`) - as one token-balanced shard
        per rank (equal row counts), with the GLOBAL token and sequence counts of all of `rows` and the
        micro-batches per rank (the same on every rank, or DDP would hang)."""
        global_tokens = sum(trained_tokens(batch, i) for i in rows)
        global_seqs = len(rows)
        rows = rows_with_gradient(batch, rows, len(self.workers))
        lengths = [len(batch.prompt_ids[i]) + len(batch.response_ids[i]) for i in rows]
        sh = dispatch.shard(rows, lengths, len(self.workers), equal_size=True)
        n_micro = max(1, math.ceil(max(len(i) for i in sh.indices) / self.mb))
        n_micro = min(n_micro, min(len(i) for i in sh.indices))
        return [take_rows(batch, s) for s in sh.shards], (global_tokens, global_seqs, n_micro)


def rows_with_gradient(batch: TrainBatch, rows: list[int], n_ranks: int) -> list[int]:
    """The rows of `rows` the update must run: all of them when the loss has a KL term (reference log-probs in
    the batch: a zero-advantage row still pulls towards the reference), else those whose advantages are not all
    exactly 0. At least `n_ranks` rows (every rank runs a forward and backward, or DDP hangs): the shortest
    zero-advantage rows make up the count (their gradient is 0). Ascending."""
    if batch.ref_logprobs:
        return list(rows)

    def zero(i: int) -> bool:
        a = batch.advantages[i]
        return all(x == 0.0 for x in a) if isinstance(a, list) else a == 0.0

    kept = [i for i in rows if not zero(i)]
    if len(kept) < min(n_ranks, len(rows)):
        spare = sorted((i for i in rows if zero(i)),
                       key=lambda i: len(batch.prompt_ids[i]) + len(batch.response_ids[i]))
        kept += spare[:min(n_ranks, len(rows)) - len(kept)]
    return sorted(kept)


def mini_batch_rows(n: int, k: int, *, seed: int) -> list[list[int]]:
    """Rows 0..n-1 in k mini-batches of near-equal size, by a seeded permutation (verl shuffles its PPO
    mini-batches too); each list ascending."""
    if k > n:
        raise ValueError(f"rl.mini_batches = {k} is more than the batch's {n} sequences")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [sorted(perm[bounds[i]:bounds[i + 1]]) for i in range(k)]
