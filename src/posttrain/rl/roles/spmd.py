"""What every RL training role's workers share (the policy, PPO's critic): N Ray actors forming ONE
torch.distributed group that run the same update - SPMD - on token-balanced shards, on the training core every
trainer uses (`posttrain.spmd`: DDP or FSDP2 per `rl.parallelism`, AdamW, gradient sync per micro-batch,
clipping, checkpointed state). `SPMDWorker` is the worker side, `SPMDGroup` the controller side (set-up and
checkpoint fan-out); each role adds only its own forward, loss and update.

State (`save_state` / `load_state`, a local folder or an fsspec URL): the trained tensors and the optimizer
through torch.distributed.checkpoint into `<state_dir>/train` (every rank its own part: sharded under FSDP2),
and every rank's torch RNG and version, one atomic file each.
"""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import torch

from posttrain.artifacts.state import read_file, write_file
from posttrain.config import ModelConfig, RLConfig
from posttrain.rl.remote import gather
from posttrain.rl.types import WorkerId
from posttrain.spmd import parallel
from posttrain.spmd.dist import DistInfo, choose_backend, device_key, group_mean, join_group, node_address
from posttrain.spmd.optim import adamw
from posttrain.spmd.state import load_train_state, save_train_state


class SPMDWorker:
    """Subclasses set: `role`, `cfg`, `model_cfg`, `rank`, `world`, `device`, `model` (the nn.Module that trains),
    `lr`, `id`, `version`, and start with `net = opt = None`."""

    role: str
    cfg: RLConfig
    model_cfg: ModelConfig
    model: torch.nn.Module
    net: torch.nn.Module | None
    opt: torch.optim.Optimizer | None

    def identity(self) -> WorkerId:
        return self.id

    def master_address(self) -> tuple[str, int]:
        return node_address()

    def device_key(self) -> str:
        return device_key(self.device)

    def setup_process_group(self, addr: str, port: int, timeout_s: float, backend: str | None = None) -> None:
        """Join the role's group (every rank at once), then spread the model over it (`rl.parallelism`) and build
        the optimizer over what this rank trains. `backend` is the group's choice (`choose_backend`); None: NCCL
        on a GPU, gloo on CPU."""
        backend = backend or ("nccl" if self.device.type == "cuda" else "gloo")
        self.info: DistInfo = join_group(addr, port, rank=self.rank, world_size=self.world, device=self.device,
                                         backend=backend, timeout_s=timeout_s)
        self.net = parallel.wrap(self.model, self.cfg.parallelism, self.info,
                                 gradient_checkpointing=self.model_cfg.gradient_checkpointing)
        self.opt = adamw(self.model, lr=self.lr, betas=(0.9, 0.99))

    def _optimizer(self) -> torch.optim.Optimizer:
        if self.opt is None:
            raise RuntimeError(f"{self.id}: setup_process_group() must run before the optimizer is used")
        return self.opt

    def _group_mean(self, total: float, count: float) -> float:
        """sum(total) / sum(count) over the group's ranks."""
        return group_mean(total, count, self.device)

    def _clip(self) -> float:
        """Clip the accumulated gradients to rl.max_grad_norm (0: off); the whole model's norm before clipping."""
        return parallel.clip_grad_norm(self.model, self.cfg.max_grad_norm)

    def save_state(self, state_dir: str) -> None:
        """Into a local folder or an fsspec URL; every rank at once."""
        save_train_state(f"{state_dir}/train", self.model, self._optimizer())
        write_file(f"{state_dir}/rng-rank{self.rank}.pt", lambda p: torch.save({"rng": torch.get_rng_state()}, p))
        write_file(f"{state_dir}/version-rank{self.rank}.json",
                   lambda p: Path(p).write_text(json.dumps({"version": self.version})))

    def load_state(self, state_dir: str) -> int:
        fs, path = fsspec.core.url_to_fs(f"{state_dir}/train/.metadata")
        if not fs.exists(path):
            raise ValueError(f"{self.id}: {state_dir} holds no {self.role} training state (no train/.metadata); a "
                             f"state written by posttrain before the shared training core (per-rank optim-rank*.pt "
                             f"files) cannot be resumed: start the run afresh")
        load_train_state(f"{state_dir}/train", self.model, self._optimizer(), who=str(self.id))
        torch.set_rng_state(read_file(f"{state_dir}/rng-rank{self.rank}.pt",
                                      lambda p: torch.load(p, weights_only=True))["rng"])
        self.version = read_file(f"{state_dir}/version-rank{self.rank}.json",
                                 lambda p: json.loads(Path(p).read_text()))["version"]
        return self.version


class SPMDGroup:
    """The controller side: form the workers' process group and fan checkpoint calls out to every rank."""

    role: str

    def __init__(self, workers: list, ids: list[WorkerId], timeout_s: float):
        self.workers, self.ids, self.timeout_s = workers, ids, timeout_s

    def identities(self) -> list[WorkerId]:
        return list(self.ids)

    def setup(self) -> None:
        keys = gather([w.device_key.remote() for w in self.workers], self.ids, stage=f"{self.role}.setup",
                      timeout_s=self.timeout_s)
        backend = choose_backend(keys)
        addr, port = gather([self.workers[0].master_address.remote()], self.ids[:1], stage=f"{self.role}.setup",
                            timeout_s=self.timeout_s)[0]
        refs = [w.setup_process_group.remote(addr, port, self.timeout_s, backend) for w in self.workers]
        gather(refs, self.ids, stage=f"{self.role}.setup", timeout_s=self.timeout_s)

    def save_state(self, state_dir: str) -> None:
        gather([w.save_state.remote(state_dir) for w in self.workers], self.ids, stage=f"{self.role}.save_state",
               timeout_s=self.timeout_s)

    def load_state(self, state_dir: str) -> int:
        versions = gather([w.load_state.remote(state_dir) for w in self.workers], self.ids,
                          stage=f"{self.role}.load_state", timeout_s=self.timeout_s)
        return versions[0]
