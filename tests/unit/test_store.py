"""Artifact store: content ids, atomic writes, verified reads, lineage, index rebuild, fsspec roots."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from posttrain.artifacts import ArtifactIntegrityError, ArtifactNotFoundError, ArtifactStore, StoreConfigError
from posttrain.artifacts.store import default_root
from tests.files import write_folder as _folder


def test_put_get_round_trip_and_same_content_same_id(tmp_path):
    store = ArtifactStore(tmp_path / "home")
    src = _folder(tmp_path, "a", {"train.jsonl": "x\n", "sub/info.json": "{}"})
    ref = store.put("dataset", "d", src, run_id="r1", parents=[], config={"task": "addition"})
    got = store.get(ref)
    assert (got / "train.jsonl").read_text() == "x\n" and (got / "sub/info.json").exists()
    again = store.put("dataset", "other-name", _folder(tmp_path, "b", {"train.jsonl": "x\n", "sub/info.json": "{}"}),
                      run_id="r2", parents=[], config={})
    assert again.id == ref.id
    m = store.manifest(ref.id)
    assert m.run_id == "r1" and m.name == "d"  # the first manifest stays
    assert m.files["train.jsonl"]["size"] == 2 and m.code["package"] and m.environment["libraries"]["torch"]
    changed = store.put("dataset", "d", _folder(tmp_path, "c", {"train.jsonl": "y\n", "sub/info.json": "{}"}),
                        run_id="r1", parents=[], config={})
    assert changed.id != ref.id


def test_tampering_is_detected_by_get_and_by_the_cli(tmp_path):
    store = ArtifactStore(tmp_path / "home")
    ref = store.put("model", "m", _folder(tmp_path, "m", {"model.safetensors": "weights", "config.json": "{}"}),
                    run_id="r", parents=[], config={})
    ok = subprocess.run([sys.executable, "-m", "posttrain.cli.store", "--home", str(tmp_path / "home"), "verify",
                         ref.id[:10]], capture_output=True, check=False, text=True, timeout=60)
    assert ok.returncode == 0 and "ok" in ok.stdout
    f = store.get(ref) / "model.safetensors"
    f.write_bytes(b"Weights")  # one byte changed
    with pytest.raises(ArtifactIntegrityError, match="model.safetensors"):
        store.get(ref)
    bad = subprocess.run([sys.executable, "-m", "posttrain.cli.store", "--home", str(tmp_path / "home"), "verify",
                          ref.id[:10]], capture_output=True, check=False, text=True, timeout=60)
    assert bad.returncode != 0 and "model.safetensors" in bad.stderr and "Traceback" not in bad.stderr


def test_lineage_links_the_right_ids_and_index_rebuilds_from_manifests(tmp_path):
    home = tmp_path / "home"
    store = ArtifactStore(home)
    ds = store.put("dataset", "d", _folder(tmp_path, "d", {"a": "1"}), run_id="run-1", parents=[], config={})
    tok = store.put("tokenizer", "t", _folder(tmp_path, "t", {"a": "2"}), run_id="run-1", parents=[ds.id], config={})
    model = store.put("model", "m", _folder(tmp_path, "m", {"a": "3"}), run_id="run-2", parents=[ds.id, tok.id],
                      config={"sft": {"steps": 5}}, metrics={"loss": 0.25})
    ev = store.put("eval", "e", _folder(tmp_path, "e", {"a": "4"}), run_id="run-2", parents=[model.id], config={},
                   metrics={"greedy_accuracy": 0.5})
    tree = store.lineage(ev.id[:8])
    assert tree.manifest.id == ev.id and tree.parents[0].manifest.id == model.id
    assert [p.manifest.id for p in tree.parents[0].parents] == [ds.id, tok.id]
    assert tree.parents[0].parents[1].parents[0].manifest.id == ds.id
    before = ([m.id for m in store.list()], [m.id for m in store.list(run_id="run-2")], [m.id for m in store.list(kind="model")])
    assert sorted(before[1]) == sorted([model.id, ev.id]) and before[2] == [model.id]
    (home / "index.sqlite").unlink()
    fresh = ArtifactStore(home)  # missing index: rebuilt from the manifests on first use
    assert ([m.id for m in fresh.list()], [m.id for m in fresh.list(run_id="run-2")],
            [m.id for m in fresh.list(kind="model")]) == before
    assert fresh.rebuild_index() == 4
    out = subprocess.run([sys.executable, "-m", "posttrain.cli.store", "--home", str(home), "lineage", ev.id[:8]],
                         capture_output=True, check=False, text=True, timeout=60)
    assert out.returncode == 0 and all(i.id[:12] in out.stdout for i in (ev, model, ds, tok))
    assert "sft.steps=5" in out.stdout and "greedy_accuracy=0.5" in out.stdout
    js = subprocess.run([sys.executable, "-m", "posttrain.cli.store", "--home", str(home), "artifacts", "list",
                         "--run", "run-1", "--json"], capture_output=True, check=False, text=True, timeout=60)
    import json

    assert sorted(m["id"] for m in json.loads(js.stdout)) == sorted([ds.id, tok.id])


def test_unknown_parent_and_unknown_id_are_clear_errors(tmp_path):
    store = ArtifactStore(tmp_path / "home")
    with pytest.raises(ArtifactNotFoundError, match="parent"):
        store.put("model", "m", _folder(tmp_path, "m", {"a": "1"}), run_id="r", parents=["f" * 64], config={})
    with pytest.raises(ArtifactNotFoundError, match="no artifact"):
        store.get("abc123")


@pytest.mark.parametrize("url", ["memory://posttrain-test-store", "file://{tmp}/fsspec-home"])
def test_store_on_an_fsspec_url(tmp_path, url):
    store = ArtifactStore(url.format(tmp=tmp_path))
    ref = store.put("dataset", "d", _folder(tmp_path, "d", {"train.jsonl": "abc"}), run_id="r", parents=[], config={})
    assert (store.get(ref) / "train.jsonl").read_text() == "abc"
    assert [m.id for m in store.list(kind="dataset")] == [ref.id]
    key = store.cache_key("stage", {"x": 1})
    store.cache_put(key, ref)
    assert store.cache_get(key) == ref


def test_cache_entry_of_a_deleted_artifact_is_a_miss(tmp_path):
    import shutil

    store = ArtifactStore(tmp_path / "home")
    ref = store.put("dataset", "d", _folder(tmp_path, "d", {"a": "1"}), run_id="r", parents=[], config={})
    key = store.cache_key("k")
    store.cache_put(key, ref)
    assert store.cache_get(key) == ref
    shutil.rmtree(tmp_path / "home" / "objects" / ref.id)
    assert store.cache_get(key) is None


def test_remote_run_refuses_the_local_default(monkeypatch):
    monkeypatch.delenv("POSTTRAIN_HOME", raising=False)
    monkeypatch.setenv("FLYTE_INTERNAL_EXECUTION_ID", "abc123")
    with pytest.raises(StoreConfigError, match="POSTTRAIN_HOME"):
        default_root()
    monkeypatch.setenv("POSTTRAIN_HOME", "s3://bucket/x")
    assert default_root() == "s3://bucket/x"


WRITER = r"""
import sys, time, shutil
from pathlib import Path
import posttrain.artifacts.store as st
from posttrain.artifacts import ArtifactStore
orig = shutil.copytree
def slow_copytree(src, dst, *a, **k):
    out = orig(src, dst, *a, **k)
    print("COPIED", flush=True)
    time.sleep(60)   # killed here: files staged, not yet renamed into place
    return out
st.shutil.copytree = slow_copytree
ArtifactStore(sys.argv[1]).put("model", "m", Path(sys.argv[2]), run_id="r", parents=[], config={})
"""


def test_writer_killed_midway_leaves_no_visible_artifact(tmp_path):
    home, src = tmp_path / "home", _folder(tmp_path, "src", {"model.safetensors": "w" * 100000, "config.json": "{}"})
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(home), str(src)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "COPIED"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    store = ArtifactStore(home)
    assert store.list() == [] and not (home / "objects").exists() or not any((home / "objects").iterdir())
    assert any((home / "tmp").iterdir())  # the staging folder is there, but invisible
    ref = store.put("model", "m", src, run_id="r2", parents=[], config={})  # a later put cleans up and succeeds
    assert store.get(ref).is_dir() and [m.id for m in store.list()] == [ref.id]
    time.sleep(0.1)
    assert not any((home / "tmp").iterdir())
