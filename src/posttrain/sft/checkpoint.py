"""The dense trainer's resumable state (every `sft.save_every` steps, atomically): model + optimizer via
torch.distributed.checkpoint (`spmd.state`, the core every trainer shares: sharded for FSDP2, only the tensors
that train with `model.lora`), the step, RNG states and the wandb run id. trainer.py (`run_sft`) saves and loads it; the state's role is described there.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from posttrain.artifacts.state import StateDir, read_file, write_file
from posttrain.spmd.dist import DistInfo
from posttrain.spmd.state import load_train_state, save_train_state


def save_state(state: StateDir, model, optimizer, step: int, wandb_id: str | None, info: DistInfo,
               history: list[dict]) -> None:
    """Every rank writes its part into step-N (torch.distributed.checkpoint: a path, or fsspec for a URL), then
    rank 0 commits it by writing step-N/meta.json last and drops older folders. A folder without meta.json
    (a kill while saving) is never loaded, and is cleared when that step is saved again."""
    name = f"step-{step:07d}"
    if info.rank == 0:
        state.remove(name)
    dist.barrier()
    save_train_state(state.url(name), model, optimizer)
    write_file(state.url(name, f"rng-rank{info.rank}.pt"), lambda p: torch.save({"cpu_rng": torch.get_rng_state()}, p))
    dist.barrier()
    if info.rank == 0:
        state.write_text(f"{name}/meta.json", json.dumps({"step": step, "wandb_id": wandb_id,
                                                          "world_size": info.world_size, "history": history}))
        for old in state.names("step-"):
            if old != name:
                state.remove(old)
    dist.barrier()


def load_state(state: StateDir, model, optimizer, stage: str = "sft") -> tuple[int, str | None, list[dict]]:
    """Restore the newest committed state; returns (step to start from, wandb run id, per-step history so far:
    empty for state saved before histories were kept). When it resumes, rank 0
    prints `<stage>: resuming at step N of saved state <folder>` (N: the first step run now, as the metric lines
    number it; steps before it are not redone)."""
    done = [n for n in state.names("step-") if state.exists(f"{n}/meta.json")]
    if not done:
        return 0, None, []
    last = done[-1]
    meta = json.loads(state.read_text(f"{last}/meta.json"))
    if meta["world_size"] != dist.get_world_size():
        raise ValueError(f"saved SFT state {state.url(last)} was written by {meta['world_size']} ranks, not "
                         f"{dist.get_world_size()}")
    load_train_state(state.url(last), model, optimizer)
    rng = f"{last}/rng-rank{dist.get_rank()}.pt"
    if state.exists(rng):
        torch.set_rng_state(read_file(state.url(rng), lambda p: torch.load(p, weights_only=True))["cpu_rng"])
    if dist.get_rank() == 0:
        print(f"{stage}: resuming at step {meta['step']} of saved state {state.url(last)}", flush=True)
    return meta["step"], meta.get("wandb_id"), meta.get("history", [])
