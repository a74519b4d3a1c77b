"""Run under torchrun by tests: one SFT step (or a short run) on a fixed global batch, dumping what each rank
saw and the resulting weights, so tests can compare splits, ranks and parallelism modes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from posttrain.config import LoraConfig, ModelConfig, Parallelism, SFTConfig
from posttrain.data.chat import tokenize_for_training
from posttrain.data.examples import read_examples
from posttrain.models.io import load_tokenizer
from posttrain.models.lora import add_adapters
from posttrain.models.tiny import build_model
from posttrain.sft.batching import collate
from posttrain.sft.trainer import Shards, make_optimizer, train_step, wrap
from posttrain.spmd.dist import init_distributed


def main() -> None:
    out, data, tok_dir, mode = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    micro, global_bs, steps = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    parallel = Parallelism(sys.argv[8]) if len(sys.argv) > 8 else Parallelism.DDP
    lora = len(sys.argv) > 9 and sys.argv[9] == "lora"  # LoRA adapters (rank 4) on the model; only they train
    info = init_distributed()
    tok = load_tokenizer(tok_dir)
    mcfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64, max_seq_len=32)
    cfg = SFTConfig(steps=steps, global_batch_size=global_bs, micro_batch_size=micro, nproc=info.world_size, lr=1e-2,
                    warmup_steps=0, parallelism=parallel, packing=(mode == "packed"))
    enc = [(tokenize_for_training(tok, e["messages"], 32),) for e in read_examples(data, "train")]
    model = build_model(mcfg, tok)
    if lora:
        model = add_adapters(model, LoraConfig(rank=4, alpha=8.0), seed=0)
    model = wrap(model, cfg, info)
    opt = make_optimizer(model, cfg)
    seen, losses = [], []
    for step in range(steps):
        if mode in ("fixed", "packed"):  # the same global batch for any split: rank r takes its contiguous slice
            per = global_bs // info.world_size
            idx = list(range(step * global_bs + info.rank * per, step * global_bs + (info.rank + 1) * per))
            batches = [collate([enc[i][0] for i in idx[j:j + micro]], pack=cfg.packing, pack_length=32, pad_id=tok.pad_token_id)
                       for j in range(0, per, micro)]
        else:  # "shards": the trainer's own per-rank data order
            shards = Shards(enc, cfg, info, tok.pad_token_id, 32)
            e, k = divmod(step, shards.per_epoch)
            from posttrain.sft.batching import rank_order

            idx = rank_order(len(enc), e, cfg.seed, info.rank, info.world_size)[k * shards.per_step:(k + 1) * shards.per_step]
            batches = shards.for_step(step)
        seen.append(idx)
        m = train_step(model, opt, batches, cfg=cfg, info=info, lr=cfg.lr, autocast=False)
        losses.append(m["loss"])
    full = {k: v.detach().cpu() for k, v in get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)).items()}
    from posttrain.rl.weight_sync import weights_checksum

    (out / f"rank{info.rank}.json").write_text(json.dumps({"seen": seen, "losses": losses,
                                                           "checksum": weights_checksum(full)}))
    if info.rank == 0:
        save_file({k: v.contiguous().clone() for k, v in full.items()}, str(out / "weights.safetensors"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
