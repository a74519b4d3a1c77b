"""Run under torchrun by tests/integration/test_dense_objectives.py: steps of one dense objective (dpo,
reward_model, distill) on a fixed global batch, dumping each rank's losses and metrics and the resulting weights,
so the tests can compare splits (1 rank x 4 micro-batches vs 2 x 2), packing and parallelism modes.

    torchrun --nproc-per-node N dense_driver.py OUT DATA TOK FROZEN OBJECTIVE MODE MICRO GLOBAL STEPS [ddp|fsdp2] [sgd]

With `sgd` the optimizer is plain SGD at lr 1, so the weights' change IS the gradient: AdamW's first steps
divide by sqrt(v), which hides a scaled gradient (a normalisation bug) and magnifies float rounding where
gradients are near zero. Rank 0 also writes the initial weights (init.safetensors).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from posttrain.config import DistillConfig, DPOConfig, ModelConfig, Parallelism, RewardModelConfig
from posttrain.data.examples import read_examples
from posttrain.models.io import load_model, load_tokenizer
from posttrain.rl.weight_sync import weights_checksum
from posttrain.sft.batching import collate
from posttrain.sft.objectives import objective_for
from posttrain.sft.trainer import build_trainee, make_optimizer, train_step, wrap
from posttrain.spmd.dist import init_distributed

MODEL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64, max_seq_len=40)
CONFIGS = {"dpo": DPOConfig, "reward_model": RewardModelConfig, "distill": DistillConfig}


def main() -> None:
    out, data, tok_dir, frozen_dir = (Path(a) for a in sys.argv[1:5])
    name, mode = sys.argv[5], sys.argv[6]
    micro, global_bs, steps = int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9])
    parallel = Parallelism(sys.argv[10]) if len(sys.argv) > 10 else Parallelism.DDP
    sgd = len(sys.argv) > 11 and sys.argv[11] == "sgd"
    info = init_distributed()
    tok = load_tokenizer(tok_dir)
    extra = {"teacher": str(frozen_dir), "temperature": 2.0} if name == "distill" else {}
    cfg = CONFIGS[name](steps=steps, global_batch_size=global_bs, micro_batch_size=micro, nproc=info.world_size,
                        lr=1e-2, warmup_steps=0, parallelism=parallel, packing=(mode == "packed"), **extra)
    objective = objective_for(cfg)
    items = [objective.encode(ex, tok, 40) for ex in read_examples(data, "train") if objective.trains_on(ex)]
    model = wrap(build_trainee(objective.name, MODEL, tok, None), cfg, info)
    frozen = load_model(frozen_dir).requires_grad_(False) if name != "reward_model" else None
    opt = torch.optim.SGD(model.parameters(), lr=1.0) if sgd else make_optimizer(model, cfg)
    init = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # a collective: every rank
    if info.rank == 0:
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in init.items()}, str(out / "init.safetensors"))
    losses, metrics = [], []
    for step in range(steps):  # the same global batch for any split: rank r takes its contiguous slice
        per = global_bs // info.world_size
        idx = list(range(step * global_bs + info.rank * per, step * global_bs + (info.rank + 1) * per))
        batches = [collate([s for i in idx[j:j + micro] for s in items[i]], pack=cfg.packing, pack_length=80,
                           pad_id=tok.pad_token_id) for j in range(0, per, micro)]
        m = train_step(model, opt, batches, cfg=cfg, info=info, lr=1.0 if sgd else cfg.lr, autocast=False,
                       objective=objective, frozen=frozen)
        losses.append(m["loss"])
        metrics.append({k: v for k, v in m.items() if isinstance(v, float) and k not in ("lr", "tokens_per_s")})
    full = {k: v.detach().cpu() for k, v in
            get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)).items()}
    (out / f"rank{info.rank}.json").write_text(json.dumps({"losses": losses, "metrics": metrics,
                                                           "checksum": weights_checksum(full)}))
    if info.rank == 0:
        save_file({k: v.contiguous().clone() for k, v in full.items()}, str(out / "weights.safetensors"))
    print(f"rank {info.rank}: outputs written", file=sys.stderr, flush=True)  # where a failed run got to
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {info.rank}: process group destroyed", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
