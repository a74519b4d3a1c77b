"""Policy role, the controller side: `PolicyGroup` drives the SPMD policy workers (`policy.PolicyWorker`) -
forms their torch.distributed group, shards each TrainBatch by tokens, gathers and reduces the ranks' stats
(checking that all ranks hold identical weights afterwards), hands the weights to weight sync, and fans
checkpoint calls out. Every remote wait is bounded by the group's timeout and names the stage and worker.
"""

from __future__ import annotations

import math

from posttrain.rl import dispatch
from posttrain.rl.remote import gather
from posttrain.rl.types import ModelPut, TrainBatch, UpdateStats, WeightsHandle, WorkerId


class PolicyGroup:
    def __init__(self, workers: list, ids: list[WorkerId], timeout_s: float, micro_batch_size: int,
                 shared_folder: str | None = None):
        """`shared_folder`: hand weights over through a file there (every rollout worker must be on rank 0's
        node: see `weight_transfer`); None: through Ray's object store."""
        self.workers, self.ids, self.timeout_s, self.mb = workers, ids, timeout_s, micro_batch_size
        self.shared_folder = shared_folder
        self.version = 0
        self._checksum: str | None = None
        """Checksum of the weights at `version`, as rank 0 reported it after the last update (None: not known
        yet - before the first update or after load_state)."""

    def identities(self) -> list[WorkerId]:
        return list(self.ids)

    def setup(self) -> None:
        keys = gather([w.device_key.remote() for w in self.workers], self.ids, stage="policy.setup",
                      timeout_s=self.timeout_s)
        backend = choose_backend(keys)
        addr, port = gather([self.workers[0].master_address.remote()], self.ids[:1], stage="policy.setup",
                            timeout_s=self.timeout_s)[0]
        refs = [w.setup_process_group.remote(addr, port, self.timeout_s, backend) for w in self.workers]
        gather(refs, self.ids, stage="policy.setup", timeout_s=self.timeout_s)

    def update(self, batch: TrainBatch, *, drift_threshold: float = math.inf) -> UpdateStats:
        """One SPMD update; stopped before its optimizer step (`applied` False, nothing changed) when the
        drift between the batch's rollout log-probs and the policy's own is above `drift_threshold` (or NaN),
        or the gradient norm is not finite."""
        lengths = [len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)]
        sh = dispatch.shard(list(range(len(lengths))), lengths, len(self.workers), equal_size=True)
        n_micro = max(1, math.ceil(max(len(i) for i in sh.indices) / self.mb))
        n_micro = min(n_micro, min(len(i) for i in sh.indices))
        global_tokens = sum(len(r) for r in batch.response_ids)
        refs = [w.update.remote(_take(batch, idx), global_tokens, len(batch.response_ids), n_micro, drift_threshold)
                for w, idx in zip(self.workers, sh.indices)]
        res = gather(refs, self.ids, stage="policy.update", timeout_s=self.timeout_s)
        if len({r["checksum"] for r in res}) != 1:
            raise RuntimeError("stage policy.update: policy ranks hold different weights after the update: " +
                               ", ".join(f"{w}={r['checksum'][:12]}" for w, r in zip(self.ids, res)))
        tok = max(1, sum(r["tok"] for r in res))
        self.version, self._checksum = res[0]["version"], res[0]["checksum"]
        return UpdateStats(policy_version=self.version, loss=sum(r["loss"] for r in res),
                           pg_loss=sum(r["pg"] for r in res) / tok, kl=sum(r["kl"] for r in res) / tok,
                           entropy=sum(r["ent"] for r in res) / tok, clip_fraction=sum(r["clip"] for r in res) / tok,
                           grad_norm=res[0]["grad_norm"], weights_checksum=res[0]["checksum"],
                           drift=res[0]["drift"], applied=res[0]["applied"], stopped=res[0]["stopped"],
                           compute_s=max(r["compute_s"] for r in res))

    def weights(self) -> WeightsHandle:
        """The weights for rollout workers. Their checksum is the one the update reported (hashing the weights
        again would only repeat it); each rollout worker then checks what it received against it."""
        if self._checksum is None:
            self._checksum = gather([self.workers[0].checksum.remote()], self.ids[:1], stage="policy.weights",
                                    timeout_s=self.timeout_s)[0]
        if self.shared_folder:
            payload = gather([self.workers[0].publish.remote(self.shared_folder)], self.ids[:1],
                             stage="policy.weights", timeout_s=self.timeout_s)[0]
        else:
            payload = self.workers[0].state_dict.remote()  # stays a reference: rollout workers fetch it themselves
        return WeightsHandle(version=self.version, checksum=self._checksum, payload=payload)

    def save_model(self, put: ModelPut) -> str:
        ids = gather([w.save_model.remote(put) for w in self.workers], self.ids, stage="policy.save_model",
                     timeout_s=self.timeout_s)
        return ids[0]

    def save_state(self, state_dir: str) -> None:
        gather([w.save_state.remote(state_dir) for w in self.workers], self.ids, stage="policy.save_state",
               timeout_s=self.timeout_s)

    def load_state(self, state_dir: str) -> int:
        versions = gather([w.load_state.remote(state_dir) for w in self.workers], self.ids, stage="policy.load_state",
                          timeout_s=self.timeout_s)
        self.version, self._checksum = versions[0], None
        return self.version


def choose_backend(device_keys: list[str]) -> str:
    """NCCL only when every rank is on a GPU of its own (distinct GPU UUIDs); gloo otherwise - NCCL refuses
    two ranks on one GPU, and CPU ranks need gloo."""
    if all(k != "cpu" for k in device_keys) and len(set(device_keys)) == len(device_keys):
        return "nccl"
    return "gloo"


def _take(b: TrainBatch, idx: list[int]) -> TrainBatch:
    return TrainBatch(policy_version=b.policy_version, prompt_ids=[b.prompt_ids[i] for i in idx],
                      response_ids=[b.response_ids[i] for i in idx], old_logprobs=[b.old_logprobs[i] for i in idx],
                      ref_logprobs=[b.ref_logprobs[i] for i in idx] if b.ref_logprobs else None,
                      advantages=[b.advantages[i] for i in idx])
