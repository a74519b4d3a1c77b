"""How the policy's weights reach rollout workers on its own node: one safetensors file in shared memory.

Through Ray's object store, each sync held three full copies of the weights at once: the policy's CPU copy,
the object store's, and the one each rollout worker unpickled (1.6 GB for a 135M-parameter model in fp32).
Here policy rank 0 streams its tensors into one file in /dev/shm (converted tensor by tensor to the dtype
the rollout generates in; no copy at all when they already are that dtype on the CPU), and every rollout
worker on that node copies them, tensor by tensor, into the weights it holds: one copy in flight, in pages
that all readers share. `PolicyGroup.weights` uses this only when every rollout worker is on policy rank 0's
node; otherwise Ray's object store carries the weights.

A tensor stored under two names (tied input/output embeddings) is written once; the other name is listed
as an alias in the file's metadata. The file is deleted as soon as every rollout worker has copied it
(`RolloutGroup.load_weights` -> `release`), so it takes RAM only during the sync; the file for version v
also replaces any left from v-1 (the controller syncs one version at a time). The folder is removed
when the run ends (`remove_folder`); a killed pod takes its /dev/shm with it.

Room. A pod's /dev/shm is whatever the pod spec gives it: 64 MiB in a default container, while a 135M model
in fp32 is 538 MB. Before the first sync, policy rank 0 checks the free space where it would write
(`choose_folder`): /dev/shm if the file fits there, else the node's temp folder (a disk file, read the same
way), else none - the weights then travel through Ray's object store. The run's log names the choice and
why. `write` checks again before each file and raises NoRoomError, naming the folder, before writing a byte.
The RayJob (tasks/rl.py) mounts a memory-backed /dev/shm sized for the weight file on every pod.

Who removes what. Every file lives on policy rank 0's node, so it is removed there: the rollout worker that
read it last releases it (`RolloutWorker.release`, on that node), and policy rank 0 removes the folder when
the run's actors are released (`PolicyWorker.remove_shared`). The controller and the driver may sit on
another node, where that path means nothing.

Checks stay where they were: each rollout worker reports the checksum of what it now holds, compared with
the policy's (posttrain.rl.weight_sync).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch.distributed.tensor import DTensor

_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


@dataclass(frozen=True, kw_only=True)
class SharedWeights:
    """Where policy version `version` was written, and on which node that file can be read."""

    path: str
    node: str
    version: int


SHM = Path("/dev/shm")
HEADROOM = 1.05
"""A folder is chosen only when its free space is at least this times the file's size."""


class NoRoomError(OSError):
    """The weight file does not fit where it was to be written."""


def folder_for(run_id: str) -> Path:
    """A per-run folder in shared memory (/dev/shm where it exists and is writable, else the temp folder)."""
    root = SHM if os.access(SHM, os.W_OK) else Path(tempfile.gettempdir())
    return root / f"posttrain-weights-{run_id}-{os.getpid()}"


def file_bytes(named: Mapping[str, torch.Tensor], dtype: torch.dtype) -> int:
    """Bytes of the tensor data `write` would store (tied tensors once), without the small header."""
    unique, _ = _unique(named)
    item = torch.empty((), dtype=dtype).element_size()
    return sum(t.numel() for t in unique.values()) * item


def free_bytes(folder: Path) -> int:
    """Free bytes on the file system that holds `folder` (or its nearest existing parent)."""
    p = Path(folder)
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def choose_folder(preferred: str | Path, needed: int,
                  fallbacks: tuple[Path, ...] | None = None) -> tuple[Path | None, str]:
    """(the folder to write weight files to - `preferred` if `needed` bytes fit there, else the same folder
    name under the first fallback root with room, else None for Ray's object store -, a sentence for the log).
    `fallbacks`: roots to try after `preferred` (default: the temp folder)."""
    preferred = Path(preferred)
    roots = fallbacks if fallbacks is not None else (Path(tempfile.gettempdir()),)
    size = f"{needed / 2**20:.1f} MiB"
    tried = []
    for folder in (preferred, *(r / preferred.name for r in roots)):
        free = free_bytes(folder)
        if free >= needed * HEADROOM:
            if not tried:
                return folder, f"a shared file in {folder} ({size}; {free / 2**20:.0f} MiB free there)"
            return folder, (f"a file in {folder} ({size}), because " + "; ".join(tried) + " - give the pods a larger "
                            "memory-backed /dev/shm (tasks/rl.py) for a file in RAM")
        tried.append(f"{folder.parent} has {free / 2**20:.1f} MiB free")
    return None, (f"Ray's object store: the weight file ({size}) fits nowhere on policy rank 0's node (" +
                  "; ".join(tried) + ")")


def release(shared: SharedWeights) -> None:
    """Delete the file once every reader has copied it (its pages are RAM until then; a reader still holding
    it open keeps its mapping until it closes)."""
    Path(shared.path).unlink(missing_ok=True)


def remove_folder(folder: str | Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _unique(named: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors with distinct storage, {alias: name it shares storage with}). A lazy mapping that computes its
    tensors when read (lora.MergedView) names the tensor each is read from with `source(name)`: storage and
    shape come from that, and nothing is computed here."""
    first: dict[tuple, str] = {}
    unique, aliases = {}, {}
    source = getattr(named, "source", None)
    for name in named:
        t = source(name) if source is not None else named[name]
        # an FSDP2 shard (DTensor): its local tensor's storage says which names share it; shape and stride are global
        local = t._local_tensor if isinstance(t, DTensor) else t
        key = (t.device, local.untyped_storage().data_ptr(), local.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
            unique[name] = t
    return unique, aliases


def write_order(named: Mapping[str, torch.Tensor]) -> list[str]:
    """The names `write` reads, in the order it reads them (tied weights once): what the ranks that only help
    gather an FSDP2 model's tensors (policy_weights.publish) must read in step with it."""
    return list(_unique(named)[0])


def write(named: Mapping[str, torch.Tensor], folder: str | Path, *, version: int, node: str,
          dtype: torch.dtype = torch.float32, keep: int = 0) -> SharedWeights:
    """Stream `named` (cast to `dtype`, moved to the CPU one tensor at a time) into folder/weights-vN.safetensors
    (written under a temporary name, then renamed) after deleting the files of older versions - all but the
    `keep` newest of them (rollout ahead of the update: loads still queued behind generations), and say where
    it is."""
    if dtype not in _DTYPES:
        raise ValueError(f"weight transfer: dtype {dtype} is not one of {sorted(map(str, _DTYPES))}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    unique, aliases = _unique(named)
    header: dict = {"__metadata__": {"aliases": json.dumps(aliases), "version": str(version)}}
    offset = 0
    for name, t in unique.items():
        size = t.numel() * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _DTYPES[dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path = folder / f"weights-v{version:06d}.safetensors"
    older = sorted(folder.glob("weights-v*"), key=lambda p: p.name)  # zero-padded versions: name order
    for old in older[:max(len(older) - keep, 0)]:  # every reader is done with these: one file's worth at a time
        old.unlink(missing_ok=True)
    need = 8 + len(raw) + offset
    if (free := free_bytes(folder)) < need:
        raise NoRoomError(f"weight transfer: version {version} needs {need / 2**20:.1f} MiB in {folder}, which has "
                          f"{free / 2**20:.1f} MiB free (nothing was written)")
    tmp = path.with_suffix(".tmp")
    with torch.no_grad(), open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in unique:
            t = named[name]  # a lazy mapping computes it now, one tensor at a time
            cpu = t.detach().to("cpu", dtype).contiguous()  # the tensor itself when already CPU + dtype
            f.write(cpu.reshape(-1).view(torch.uint8).numpy().data)
    os.replace(tmp, path)
    return SharedWeights(path=str(path), node=node, version=version)


class _Reader(Mapping):
    """The file's tensors by name (aliases included), each read from the mapped file when asked for."""

    def __init__(self, handle, aliases: dict[str, str]):
        self.handle, self.aliases = handle, aliases
        self.names = list(handle.keys()) + list(aliases)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.handle.get_tensor(self.aliases.get(name, name))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


@contextmanager
def read(shared: SharedWeights, node: str) -> Iterator[Mapping[str, torch.Tensor]]:
    """The tensors of `shared` as a lazy mapping; refuses a file written on another node (not readable here)."""
    if shared.node != node:
        raise RuntimeError(f"weight transfer: version {shared.version} was written to {shared.path} on node "
                           f"{shared.node}, but this worker runs on node {node}; shared-memory transfer needs "
                           "both on one node")
    with safe_open(shared.path, framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("version") != str(shared.version):
            raise RuntimeError(f"weight transfer: {shared.path} holds version {meta.get('version')}, "
                               f"expected {shared.version}")
        yield _Reader(f, json.loads(meta.get("aliases", "{}")))


def copy_into(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy `state` into the model's own tensors, one at a time (cast to their dtype and device); the names
    must match exactly. Unlike load_state_dict, never materialises a second full set of weights."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"weight transfer: names differ from the model's: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, t in own.items():
            t.copy_(state[name])
