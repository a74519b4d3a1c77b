"""Run under torchrun by tests/integration/test_rl_spmd_core.py: the RL policy's (or PPO critic's) real worker on
every rank - joined into one group the way the RL task's Ray actors join it - runs two updates of a fixed batch
(token-balanced shards cut by the real PolicyGroup / CriticGroup code), with uneven forwards between them (the
reference pass with LoRA, values over shards of different sizes), and dumps what the tests compare: the stats,
the gathered weights (the policy's as the rollout gets them: LoRA merged), the checksum, the uneven passes'
output and which tensors the updates moved.

    torchrun --nproc-per-node N rl_spmd_driver.py OUT MODEL_DIR ROLE PARALLELISM LORA MICRO_BATCH
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
from pathlib import Path

import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from posttrain.config import KLEstimator, LoraConfig, MismatchCorrection, ModelConfig, Parallelism, RLConfig
from posttrain.rl.roles.critic import CriticBatch, CriticWorker
from posttrain.rl.roles.critic_group import CriticGroup
from posttrain.rl.roles.policy import PolicyWorker
from posttrain.rl.roles.policy_group import PolicyGroup
from posttrain.rl.types import TrainBatch
from posttrain.spmd.dist import init_distributed


def batch(vocab: int, n: int = 8) -> TrainBatch:
    """Prompts and responses of skewed lengths, off-policy old log-probs (the clip engages), reference log-probs
    (the KL term contributes), per-sequence advantages: the same on every rank and in every run."""
    rng = random.Random(0)
    prompts = [[rng.randrange(4, vocab) for _ in range(rng.choice([3, 5, 9]))] for _ in range(n)]
    responses = [[rng.randrange(4, vocab) for _ in range(rng.choice([1, 2, 4, 7]))] for _ in range(n)]
    old = [[-3.0 + rng.uniform(-0.5, 0.5) for _ in r] for r in responses]
    ref = [[-3.0 + rng.uniform(-0.3, 0.3) for _ in r] for r in responses]
    return TrainBatch(policy_version=0, prompt_ids=prompts, response_ids=responses, old_logprobs=old,
                      ref_logprobs=ref, advantages=[rng.gauss(0, 1) for _ in range(n)])


def main() -> None:
    out, model_dir, role, parallelism = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Parallelism(sys.argv[4])
    lora = LoraConfig(rank=4, alpha=8.0) if sys.argv[5] == "lora" else None
    micro = int(sys.argv[6])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cfg = RLConfig(lr=1e-3, critic_lr=1e-3, inner_epochs=2, mini_batches=2, micro_batch_size=micro, kl_coef=0.1,
                   kl_estimator=KLEstimator.K3, max_grad_norm=0.5, warmup_steps=0, parallelism=parallelism,
                   mismatch_correction=MismatchCorrection.TOKEN_TIS)
    model_cfg = ModelConfig(lora=lora)
    worker = (PolicyWorker if role == "policy" else CriticWorker)(model_dir, cfg, rank, world, model_cfg)
    init_distributed()  # torchrun's group; the worker's own set-up then only wraps the model and builds the optimizer
    worker.setup_process_group(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 120, "gloo")
    init = full_weights(worker.model)  # every tensor as it starts (LoRA: unmerged)
    b = batch(worker.tok.vocab_size)
    ids = [None] * world  # the groups' sharding code only counts the workers
    record: dict = {"stats": []}
    if role == "policy":
        group = PolicyGroup([None] * world, ids, 60, micro_batch_size=micro, mini_batches=2, seed=0)
        for step in range(2):
            per_mb = [group._shard(b, rows) for rows in group_rows(b, step)]
            u = worker.update([mb[0][rank] for mb in per_mb], *[[mb[1][c] for mb in per_mb] for c in range(3)])
            record["stats"].append([u.loss, u.grad_norm, u.tokens])
            # uneven forwards: rank r scores r + 1 rows (the reference with LoRA, else the policy's own log-probs)
            rows = list(range(rank + 1))
            score = worker.base_log_probs if lora else worker.log_probs
            record[f"uneven{step}"] = score([b.prompt_ids[i] for i in rows], [b.response_ids[i] for i in rows], 1.0)[0]
            b = dataclasses.replace(b, policy_version=worker.version)
        weights = worker.state_dict()  # every rank takes part; rank 0 answers
    else:
        group = CriticGroup([None] * world, ids, 60, micro_batch_size=micro, mini_batches=2, seed=0)
        for step in range(2):
            rows = list(range(rank + 1))
            record[f"uneven{step}"] = worker.values([b.prompt_ids[i] for i in rows], [b.response_ids[i] for i in rows])[0]
            cb = CriticBatch(policy_version=step, prompt_ids=b.prompt_ids, response_ids=b.response_ids,
                             old_values=[[0.1 * (i % 3)] * len(r) for i, r in enumerate(b.response_ids)],
                             returns=[[float(i % 2)] * len(r) for i, r in enumerate(b.response_ids)])
            per_mb = [group._shard(cb, r) for r in group_rows(b, step)]
            u = worker.update([mb[0][rank] for mb in per_mb], [mb[1] for mb in per_mb], [mb[2] for mb in per_mb])
            record["stats"].append([u.loss, u.grad_norm, u.tokens])
        weights = full_weights(worker.model)
    trained = full_weights(worker.model)
    record["checksum"] = worker.checksum()
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    if rank == 0:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "weights.safetensors"))
        moved = sorted(k for k in init if float((trained[k] - init[k]).abs().max()) > 1e-4)
        (out / "moved.json").write_text(json.dumps(moved))
    dist.barrier()
    dist.destroy_process_group()


def full_weights(model) -> dict:
    """The whole model gathered on rank 0 (torch's full state dict, as the trainers save it), copied so later
    steps do not change it (on CPU an unsharded model's tensors come back as the live parameters); {} elsewhere."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().clone() for k, v in state.items()}


def group_rows(b: TrainBatch, step: int) -> list[list[int]]:
    from posttrain.rl.roles.policy_group import mini_batch_rows

    return mini_batch_rows(len(b.response_ids), 2, seed=step)


if __name__ == "__main__":
    main()
