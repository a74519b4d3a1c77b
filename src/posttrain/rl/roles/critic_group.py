"""Critic role, the controller side: `CriticGroup` drives the SPMD critic workers (`critic.CriticWorker`) - forms
their process group, splits `values` calls by tokens across the ranks and merges them back in order, shards
each CriticBatch like the policy's (mini-batches by the same seeded permutation, then token-balanced, equal
row counts per rank), reduces the ranks' stats (checking that all ranks hold identical weights afterwards) and
fans checkpoint calls out (spmd.SPMDGroup). Every remote wait is bounded and names the stage and worker.
"""

from __future__ import annotations

import math

from posttrain.rl import dispatch
from posttrain.rl.ragged import take_rows, trained_tokens
from posttrain.rl.remote import gather
from posttrain.rl.roles.critic import CriticBatch, CriticFit, CriticStats, Values
from posttrain.rl.roles.policy_group import mini_batch_rows
from posttrain.rl.roles.spmd import SPMDGroup
from posttrain.rl.types import RankUpdate, Trajectories, WorkerId


class CriticGroup(SPMDGroup):
    role = "critic"

    def __init__(self, workers: list, ids: list[WorkerId], timeout_s: float, micro_batch_size: int,
                 mini_batches: int = 1, seed: int = 0, epochs: int = 1):
        super().__init__(workers, ids, timeout_s)
        self.mb, self.mini_batches, self.seed, self._epochs = micro_batch_size, mini_batches, seed, epochs
        self._one_pass: bool | None = None

    def values(self, trajectories: Trajectories) -> Values:
        t = trajectories
        lengths = [len(p) + len(r) for p, r in zip(t.prompt_ids, t.response_ids)]
        sh = dispatch.shard(list(range(len(lengths))), lengths, len(self.workers))
        refs = [w.values.remote([t.prompt_ids[i] for i in idx], [t.response_ids[i] for i in idx])
                for w, idx in zip(self.workers, sh.indices)]
        res = gather(refs, self.ids, stage="critic.values", timeout_s=self.timeout_s)
        return Values(policy_version=t.policy_version, values=dispatch.merge(sh, [r[0] for r in res]),
                      compute_s=max(r[1] for r in res))

    def one_pass(self) -> bool:
        """Whether `fit` may replace values() + update(): one pass of one mini-batch, and a model without
        dropout (asked of rank 0; every rank holds the same model)."""
        if self.mini_batches != 1 or self._epochs != 1:
            return False
        if self._one_pass is None:
            self._one_pass = gather([self.workers[0].one_pass.remote()], self.ids[:1], stage="critic.one_pass",
                                    timeout_s=self.timeout_s)[0]
        return self._one_pass

    def fit(self, batch: CriticFit) -> tuple[Values, CriticStats]:
        """Values and one update from ONE forward per micro-batch (CriticWorker.fit); the values come back in the
        batch's order."""
        rows = list(range(len(batch.response_ids)))
        lengths = [len(batch.prompt_ids[i]) + len(batch.response_ids[i]) for i in rows]
        sh = dispatch.shard(rows, lengths, len(self.workers), equal_size=True)
        n_micro = min(max(1, math.ceil(max(len(i) for i in sh.indices) / self.mb)), min(len(i) for i in sh.indices))
        total = sum(trained_tokens(batch, i) for i in rows)
        refs = [w.fit.remote(CriticFit(policy_version=batch.policy_version,
                                       prompt_ids=[batch.prompt_ids[i] for i in s],
                                       response_ids=[batch.response_ids[i] for i in s],
                                       token_rewards=[batch.token_rewards[i] for i in s], gamma=batch.gamma,
                                       lam=batch.lam), total, n_micro) for w, s in zip(self.workers, sh.shards)]
        res = gather(refs, self.ids, stage="critic.fit", timeout_s=self.timeout_s)
        values = Values(policy_version=batch.policy_version, values=dispatch.merge(sh, [r.values for r in res]),
                        compute_s=0.0)
        return values, self._stats(res)

    def update(self, batch: CriticBatch) -> CriticStats:
        rows = (mini_batch_rows(len(batch.response_ids), self.mini_batches, seed=self.seed + batch.policy_version)
                if self.mini_batches > 1 else [list(range(len(batch.response_ids)))])
        per_mb = [self._shard(batch, r) for r in rows]
        refs = [w.update.remote([mb[0][k] for mb in per_mb], [mb[1] for mb in per_mb], [mb[2] for mb in per_mb])
                for k, w in enumerate(self.workers)]
        res = gather(refs, self.ids, stage="critic.update", timeout_s=self.timeout_s)
        return self._stats(res)

    def _stats(self, res: list[RankUpdate]) -> CriticStats:
        if len({r.checksum for r in res}) != 1:
            raise RuntimeError("stage critic.update: critic ranks hold different weights after the update: " +
                               ", ".join(f"{w}={r.checksum[:12]}" for w, r in zip(self.ids, res)))
        tok, first = max(1, sum(r.tokens for r in res)), res[0]
        return CriticStats(value_loss=sum(r.loss for r in res) / tok,
                           clip_fraction=sum(r.sums.clip for r in res) / tok,
                           values_mean=sum(r.sums.values for r in res) / tok, grad_norm=first.grad_norm,
                           version=first.version, weights_checksum=first.checksum,
                           compute_s=max(r.compute_s for r in res), applied=first.applied, stopped=first.stopped)

    def _shard(self, b: CriticBatch, rows: list[int]) -> tuple[list[CriticBatch], int, int]:
        lengths = [len(b.prompt_ids[i]) + len(b.response_ids[i]) for i in rows]
        sh = dispatch.shard(rows, lengths, len(self.workers), equal_size=True)
        n_micro = min(max(1, math.ceil(max(len(i) for i in sh.indices) / self.mb)), min(len(i) for i in sh.indices))
        return [take_rows(b, s) for s in sh.shards], sum(trained_tokens(b, i) for i in rows), n_micro
