"""What every training role's workers share (the policy, PPO's critic): N workers forming ONE torch.distributed
group that run the same update - SPMD - on token-balanced shards, with the optimizer, the group statistics and
the resumable state that go with it. `SPMDWorker` is the worker side, `SPMDGroup` the controller side (set-up
and checkpoint fan-out); each role adds its own forward, loss and update.

Optimizer: with more than one rank the AdamW moments are sharded across the ranks (ZeRO stage 1,
`ZeroRedundancyOptimizer`: each rank steps its share and broadcasts the result) and the model is wrapped in
DDP (`gradient_as_bucket_view`: the buckets are the gradients, no second copy); one rank trains the model
itself, without DDP (nothing to all-reduce). Both give the same update as plain DDP + AdamW.

State (`save_state` / `load_state`, a local folder or an fsspec URL, one atomic file at a time): rank 0 writes
the weights (`<role>.safetensors`), every rank its optimizer shard, torch RNG and version.
"""

from __future__ import annotations

import datetime
import json
import socket
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.optim import ZeroRedundancyOptimizer

from posttrain.artifacts.state import read_file, write_file
from posttrain.models.lora import has_adapters
from posttrain.rl.remote import gather
from posttrain.rl.types import WorkerId


class SPMDWorker:
    """Subclasses set: `role`, `rank`, `world`, `device`, `model` (the nn.Module that trains), `lr`, `id`,
    `version`, and start with `net = opt = None`."""

    role: str
    model: torch.nn.Module
    net: torch.nn.Module | None
    opt: torch.optim.Optimizer | None

    def identity(self) -> WorkerId:
        return self.id

    def master_address(self) -> tuple[str, int]:
        """This node's address (as Ray knows it, so ranks on other nodes can reach it) and a free port."""
        host = "127.0.0.1"
        try:
            import ray

            if ray.is_initialized():
                host = ray.util.get_node_ip_address()
        except ImportError:
            pass
        with socket.socket() as s:
            s.bind((host, 0))
            return host, s.getsockname()[1]

    def device_key(self) -> str:
        """"cpu", or the UUID of this rank's GPU (ranks on different nodes see different UUIDs; ranks
        sharing a GPU the same one)."""
        if self.device.type != "cuda":
            return "cpu"
        return str(torch.cuda.get_device_properties(self.device).uuid)

    def setup_process_group(self, addr: str, port: int, timeout_s: float, backend: str | None = None) -> None:
        """Join the role's group (every rank calls this at once; it blocks until all have joined). `backend`
        is chosen by the group (`choose_backend`); None: NCCL on a GPU, gloo on CPU. Each role's workers are
        their own processes, so each role has its own default group."""
        backend = backend or ("nccl" if self.device.type == "cuda" else "gloo")
        if not dist.is_initialized():
            dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                    world_size=self.world, timeout=datetime.timedelta(seconds=timeout_s))
        if self.world > 1:
            self.net = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                gradient_as_bucket_view=True)
        else:  # nothing to all-reduce; DDP's buckets would keep a second home for the gradients between updates
            self.net = self.model
        kw = {"lr": self.lr, "betas": (0.9, 0.99), "weight_decay": 0.0}
        params = [p for p in self.model.parameters() if p.requires_grad]  # with LoRA: the adapters alone
        self.opt = (ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, **kw)
                    if self.world > 1 else torch.optim.AdamW(params, **kw))

    def _local_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer holding this rank's moments (its shard under ZeRO): what save_state/load_state keep."""
        if self.opt is None:
            raise RuntimeError(f"{self.id}: setup_process_group() must run before the optimizer is used")
        return self.opt.optim if isinstance(self.opt, ZeroRedundancyOptimizer) else self.opt

    def _group_mean(self, total: float, count: float) -> float:
        """sum(total) / sum(count) over the group's ranks."""
        if dist.is_initialized() and self.world > 1:
            t = torch.tensor([total, count], dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            total, count = float(t[0]), float(t[1])
        return total / max(count, 1.0)

    def save_state(self, state_dir: str) -> None:
        """Into a local folder or an fsspec URL, one atomic file at a time (artifacts/state.py)."""
        if self.rank == 0:
            weights = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in self._trained_weights().items()}
            write_file(f"{state_dir}/{self.role}.safetensors", lambda p: save_file(weights, p))
            del weights
        write_file(f"{state_dir}/optim-rank{self.rank}.pt", lambda p: torch.save(
            {"optim": self._local_optimizer().state_dict(), "rng": torch.get_rng_state()}, p))
        write_file(f"{state_dir}/version-rank{self.rank}.json",
                   lambda p: Path(p).write_text(json.dumps({"version": self.version})))

    def _trained_weights(self) -> dict[str, torch.Tensor]:
        """What the state holds of the model: every weight, or with LoRA only the adapters (the frozen base is
        the start model's, which every restart loads again)."""
        sd = self.model.state_dict()
        if not has_adapters(self.model):
            return sd
        trained = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v for k, v in sd.items() if k in trained}

    def load_state(self, state_dir: str) -> int:
        weights = read_file(f"{state_dir}/{self.role}.safetensors", load_file)
        if has_adapters(self.model):
            want = set(self._trained_weights())
            if set(weights) != want:
                raise ValueError(f"{self.id}: saved {self.role} state {state_dir} holds {len(weights)} tensors, not "
                                 f"this model's {len(want)} adapter tensors (was it saved with other model.lora "
                                 f"settings?)")
            self.model.load_state_dict(weights, strict=False)
        else:
            self.model.load_state_dict(weights)
        s = read_file(f"{state_dir}/optim-rank{self.rank}.pt",
                      lambda p: torch.load(p, weights_only=True, map_location="cpu"))
        self._local_optimizer().load_state_dict(s["optim"])
        torch.set_rng_state(s["rng"])
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


def choose_backend(device_keys: list[str]) -> str:
    """NCCL only when every rank is on a GPU of its own (distinct GPU UUIDs); gloo otherwise - NCCL refuses
    two ranks on one GPU, and CPU ranks need gloo."""
    if all(k != "cpu" for k in device_keys) and len(set(device_keys)) == len(device_keys):
        return "nccl"
    return "gloo"
