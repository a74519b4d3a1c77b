"""Policy -> rollout weight transfer through a shared-memory safetensors file (posttrain.rl.weight_transfer)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from posttrain.rl import weight_transfer as wt
from posttrain.rl.weight_sync import weights_checksum


class Tied(torch.nn.Module):
    """Input and output embeddings share one tensor, as in SmolLM2."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(50, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 50, bias=False)
        self.head.weight = self.emb.weight


def test_round_trip_writes_tied_weights_once_and_holds_the_same_checksum(tmp_path):
    src, dst = Tied(0), Tied(1)
    assert weights_checksum(src.state_dict()) != weights_checksum(dst.state_dict())
    shared = wt.write(src.state_dict(), tmp_path / "w", version=3, node="n1")
    assert shared.version == 3 and shared.node == "n1" and shared.path.endswith("weights-v000003.safetensors")
    with safe_open(shared.path, framework="pt") as f:
        assert set(f.keys()) == {"emb.weight", "norm.weight", "norm.bias"}  # the tied head: once, as an alias
        assert json.loads(f.metadata()["aliases"]) == {"head.weight": "emb.weight"}
    plain = load_file(shared.path)  # a valid safetensors file for any reader
    assert torch.equal(plain["emb.weight"], src.emb.weight.detach())
    with wt.read(shared, "n1") as state:
        assert set(state) == set(src.state_dict())
        wt.copy_into(dst, state)
    assert weights_checksum(dst.state_dict()) == weights_checksum(src.state_dict())
    assert dst.head.weight is dst.emb.weight  # copied into the model's own tensors: still tied


def test_bf16_transfer_rounds_like_the_policy_and_a_new_version_replaces_the_old_file(tmp_path):
    src, dst = Tied(0), Tied(1)
    v1 = wt.write(src.state_dict(), tmp_path, version=1, node="n", dtype=torch.bfloat16)
    with wt.read(v1, "n") as state:
        wt.copy_into(dst, state)
    assert dst.emb.weight.dtype == torch.float32
    assert torch.equal(dst.emb.weight, src.emb.weight.detach().to(torch.bfloat16).float())
    v2 = wt.write(src.state_dict(), tmp_path, version=2, node="n")
    assert [p.name for p in tmp_path.iterdir()] == ["weights-v000002.safetensors"]
    stale = wt.SharedWeights(path=v2.path, node="n", version=1)
    with pytest.raises(RuntimeError, match="holds version 2, expected 1"), wt.read(stale, "n"):
        pass


def test_a_file_from_another_node_or_with_other_names_is_refused(tmp_path):
    shared = wt.write(Tied(0).state_dict(), tmp_path, version=0, node="node-a")
    with pytest.raises(RuntimeError, match="on node node-a, but this worker runs on node node-b"), \
            wt.read(shared, "node-b"):
        pass
    other = torch.nn.Linear(8, 50)
    with wt.read(shared, "node-a") as state, pytest.raises(ValueError, match="names differ"):
        wt.copy_into(other, state)


def test_rollout_group_deletes_the_shared_file_once_every_worker_holds_the_weights(folders, tmp_path):
    """The file is RAM until deleted; once both rollout workers copied it, it must be gone - and both hold
    exactly the published weights."""
    from posttrain.models.io import load_model
    from posttrain.rl.remote import LocalActor
    from posttrain.rl.roles.rollout import RolloutGroup, RolloutWorker
    from posttrain.rl.types import WeightsHandle

    workers = [RolloutWorker(str(folders["tiny"]), rank, 2, threads=torch.get_num_threads()) for rank in range(2)]
    group = RolloutGroup([LocalActor(w) for w in workers], [w.identity() for w in workers], timeout_s=60)
    policy = load_model(folders["tiny"])
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    expected = weights_checksum(policy.state_dict())
    assert workers[0].engine.checksum() != expected
    shared = wt.write(policy.state_dict(), tmp_path, version=1, node=workers[0].identity().node)
    reports = group.load_weights(WeightsHandle(version=1, checksum=expected, payload=shared))
    assert [(r.version, r.checksum) for r in reports] == [(1, expected)] * 2
    assert list(tmp_path.iterdir()) == []


def test_role_workers_take_placement_torch_threads(folders):
    from posttrain.config import RLConfig
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.roles.rollout import RolloutWorker

    before = torch.get_num_threads()
    try:
        RolloutWorker(str(folders["tiny"]), 0, 1, threads=2)
        assert torch.get_num_threads() == 2
        PolicyWorker(str(folders["tiny"]), RLConfig(), 0, 1, threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def small_shm(tmp_path):
    """A 1 MiB memory-backed file system, like a default container's /dev/shm (64 MiB) is to a real model."""
    import subprocess

    mnt = tmp_path / "shm"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True,
                      check=False).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root): the room checks run where it can")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_too_small_shm_falls_back_to_a_disk_file_then_to_the_object_store_and_says_why(small_shm, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    need = 4 * 2**20  # a 4 MiB weight file: more than the 1 MiB tmpfs holds
    folder, why = wt.choose_folder(small_shm / "posttrain-weights-r", need, fallbacks=(disk,))
    assert folder == disk / "posttrain-weights-r"
    assert f"{small_shm} has 1.0 MiB free" in why and "4.0 MiB" in why and "/dev/shm" in why
    folder, why = wt.choose_folder(small_shm / "posttrain-weights-r", 1024, fallbacks=(disk,))
    assert folder == small_shm / "posttrain-weights-r" and why.startswith("a shared file in")
    too_big = wt.free_bytes(disk) * 2
    folder, why = wt.choose_folder(small_shm / "posttrain-weights-r", too_big, fallbacks=(disk,))
    assert folder is None and why.startswith("Ray's object store") and str(disk) in why


def test_write_refuses_a_file_that_does_not_fit_before_writing_a_byte(small_shm):
    big = {"w": torch.zeros(512, 1024)}  # 2 MiB in fp32
    with pytest.raises(wt.NoRoomError, match=r"version 3 needs 2.0 MiB in .*which has 1.0 MiB free"):
        wt.write(big, small_shm / "run", version=3, node="n")
    assert list((small_shm / "run").iterdir()) == []
    assert wt.file_bytes(big, torch.bfloat16) == 2**20


def test_the_policy_worker_picks_where_its_weights_fit_and_removes_them_on_its_node(folders, small_shm, tmp_path):
    from posttrain.config import RLConfig
    from posttrain.rl.roles.policy import PolicyWorker

    w = PolicyWorker(str(folders["tiny"]), RLConfig(), 0, 1, threads=1)
    need = wt.file_bytes(w.model.state_dict(), w.sync_dtype)
    assert need > 2**20  # the tiny model does not fit the 1 MiB tmpfs
    folder, why = w.choose_shared_folder(str(small_shm / "posttrain-weights-x"))
    assert folder is not None and not folder.startswith(str(small_shm)) and "has 1.0 MiB free" in why
    shared = w.publish(folder)
    assert shared.path.startswith(folder)
    w.remove_shared()
    assert not (small_shm / "posttrain-weights-x").exists() and not __import__("os").path.exists(folder)


def test_with_loads_still_queued_the_newest_older_files_stay(tmp_path):
    """Rollout ahead by k (rl.max_staleness): k - 1 loads may still wait in the queue when a version is written,
    so write keeps that many older files and deletes the rest."""
    sd = Tied(0).state_dict()
    for v in (1, 2, 3):
        wt.write(sd, tmp_path, version=v, node="n", keep=1)
    assert sorted(p.name for p in tmp_path.glob("weights-v*")) == ["weights-v000002.safetensors",
                                                                  "weights-v000003.safetensors"]
