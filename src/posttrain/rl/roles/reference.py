"""Reference role: log-probs of the frozen starting model for the KL penalty. The controller creates it
only when rl.kl_coef > 0 (with no KL term it would be pure cost).

The model sits on the worker's device (`local_device()`), in bf16 on CUDA when model.dtype is BF16. Its
log-probs are those of the same sampling distribution as the policy's (temperature, rl.top_k, rl.top_p,
renormalised; the scored token is never truncated away, so the KL stays finite)."""

from __future__ import annotations

import time

from posttrain.config import ModelConfig, RLConfig
from posttrain.models.head_logprobs import sequence_logprobs
from posttrain.models.io import load_model, load_tokenizer, local_device
from posttrain.rl import dispatch
from posttrain.rl.remote import gather
from posttrain.rl.roles.common import set_torch_threads, where, worker_identity
from posttrain.rl.types import LogProbs, Trajectories, WorkerId


class ReferenceWorker:
    role = "reference"

    def __init__(self, model_dir: str, rank: int, world_size: int, cfg: RLConfig | None = None,
                 model_cfg: ModelConfig | None = None, threads: int = 1):
        """`cfg` supplies top_p/top_k (default: none), `model_cfg` the dtype (default fp32), `threads` torch's
        intra-op threads (placement.generation_threads)."""
        set_torch_threads(threads)
        self.cfg, model_cfg = cfg or RLConfig(), model_cfg or ModelConfig()
        self.device = local_device()
        self.model = load_model(model_dir, device=self.device, dtype=model_cfg.dtype)
        self.tok = load_tokenizer(model_dir)
        self.id = worker_identity(self.role, rank, world_size)

    def identity(self) -> WorkerId:
        return self.id

    def where(self) -> dict:
        return where()

    def log_probs(self, prompt_ids, response_ids, temperature: float) -> tuple[list[list[float]], float]:
        t0 = time.perf_counter()
        lp = sequence_logprobs(self.model, prompt_ids, response_ids, temperature=temperature,
                               pad_id=self.tok.pad_token_id, top_p=self.cfg.top_p, top_k=self.cfg.top_k,
                               share_prompt=self.cfg.share_prompt)
        return [x.tolist() for x in lp], time.perf_counter() - t0


class ReferenceGroup:
    role = "reference"

    def __init__(self, workers: list, ids: list[WorkerId], timeout_s: float):
        self.workers, self.ids, self.timeout_s = workers, ids, timeout_s

    def identities(self) -> list[WorkerId]:
        return list(self.ids)

    def log_probs(self, trajectories: Trajectories, *, temperature: float) -> LogProbs:
        t = trajectories
        lengths = [len(p) + len(r) for p, r in zip(t.prompt_ids, t.response_ids)]
        sh = dispatch.shard(list(range(len(lengths))), lengths, len(self.workers))
        refs = [self.worker_log_probs(w, [t.prompt_ids[i] for i in idx], [t.response_ids[i] for i in idx],
                                      temperature)
                for w, idx in zip(self.workers, sh.indices)]
        results = gather(refs, self.ids, stage=f"{self.role}.log_probs", timeout_s=self.timeout_s)
        return LogProbs(policy_version=t.policy_version, values=dispatch.merge(sh, [r[0] for r in results]),
                           compute_s=max(r[1] for r in results))

    @staticmethod
    def worker_log_probs(w, prompt_ids, response_ids, temperature: float):
        """One worker's shard: `ReferenceWorker.log_probs` (PolicyBaseReference: the policy's `base_log_probs`)."""
        return w.log_probs.remote(prompt_ids, response_ids, temperature)


class PolicyBaseReference(ReferenceGroup):
    """The reference with `model.lora`: the policy workers' own model with its adapters off (`base_log_probs`) -
    the start model, in the policy's processes, never loaded a second time; no reference workers start."""

    def __init__(self, policy):
        super().__init__(policy.workers, policy.ids, policy.timeout_s)

    @staticmethod
    def worker_log_probs(w, prompt_ids, response_ids, temperature: float):
        """One policy rank's shard: `PolicyWorker.base_log_probs` (its model with the adapters off)."""
        return w.base_log_probs.remote(prompt_ids, response_ids, temperature)
