"""Identical files are stored once: a second artifact holding the same weights hard-links the first one's file
(one inode, one copy on disk), verification still re-hashes every file, and a stored file edited in place is
never linked into a later artifact."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.artifacts import ArtifactIntegrityError, ArtifactStore

MB = 1 << 20


def _model_folder(tmp: Path, name: str, weights: bytes, config: str) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "model.safetensors").write_bytes(weights)
    (d / "config.json").write_text(config)
    return d


def _disk_bytes(root: Path) -> int:
    """Bytes of file content under `root`, each inode counted once (what `du` reports, without block rounding)."""
    seen, total = set(), 0
    for f in root.rglob("*"):
        if f.is_file():
            st = f.stat()
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def test_two_artifacts_with_the_same_weight_file_use_the_disk_once(tmp_path):
    home = tmp_path / "home"
    store = ArtifactStore(home)
    weights = os.urandom(MB)
    a = store.put("model", "a", _model_folder(tmp_path, "a", weights, '{"step": 1}'), run_id="r", parents=[], config={})
    b = store.put("model", "b", _model_folder(tmp_path, "b", weights, '{"step": 2}'), run_id="r", parents=[a.id],
                  config={})
    assert a.id != b.id  # different artifacts (config.json differs) ...
    fa, fb = store.get(a) / "model.safetensors", store.get(b) / "model.safetensors"
    sa, sb = fa.stat(), fb.stat()
    assert (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)  # ... sharing one copy of the weights
    assert sa.st_nlink == 3  # artifact a, artifact b, and the blob entry
    assert MB <= _disk_bytes(home / "objects") < MB + 64 * 1024
    assert fb.read_bytes() == weights and store.verify(b).id == b.id
    # Storing the same folder again adds nothing: same id, no new copy or link.
    again = store.put("model", "a-again", _model_folder(tmp_path, "a2", weights, '{"step": 1}'), run_id="r2",
                      parents=[], config={})
    assert again.id == a.id and fa.stat().st_nlink == 3 and len(list((home / "objects").iterdir())) == 2


def test_verify_and_tamper_detection_still_hold_for_linked_files(tmp_path):
    home = tmp_path / "home"
    store = ArtifactStore(home)
    weights = os.urandom(MB)
    a = store.put("model", "a", _model_folder(tmp_path, "a", weights, "{}"), run_id="r", parents=[], config={})
    b = store.put("model", "b", _model_folder(tmp_path, "b", weights, '{"x": 1}'), run_id="r", parents=[], config={})
    with open(store.get(a) / "model.safetensors", "r+b") as f:  # edit one stored copy in place: flip its first
        f.write(bytes([weights[0] ^ 0xFF]))  # byte (writing a fixed byte left it unchanged when it was already that)
    for ref in (a, b):  # the copy is shared, so both artifacts report it
        with pytest.raises(ArtifactIntegrityError, match="model.safetensors"):
            store.get(ref)
    bad = subprocess.run([sys.executable, "-m", "posttrain.cli.store", "--home", str(home), "verify", b.id[:12]],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode != 0 and "model.safetensors" in bad.stderr
    # A later artifact with the original weights gets a good copy, never the edited inode.
    c = store.put("model", "c", _model_folder(tmp_path, "c", weights, '{"x": 2}'), run_id="r", parents=[], config={})
    fc = store.get(c) / "model.safetensors"
    assert fc.read_bytes() == weights and fc.stat().st_ino != (store.get(a, verify=False) / "model.safetensors").stat().st_ino
    d = store.put("model", "d", _model_folder(tmp_path, "d", weights, '{"x": 3}'), run_id="r", parents=[], config={})
    assert (store.get(d) / "model.safetensors").stat().st_ino == fc.stat().st_ino  # the good copy is the new blob
