"""Lineage that is always right, and an index that rebuilds itself.

An artifact's id covers its kind, its files and its parents, so the same bytes made from different inputs are
different artifacts (each with the parents of the run that made it) while the files stay stored once on disk.
A garbage, empty or table-less `index.sqlite` is rebuilt from the manifests instead of failing.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from posttrain.artifacts import ArtifactStore
from tests.files import write_folder as _folder


def _ancestors(node) -> list[str]:
    out = []
    for p in node.parents:
        out += [p.manifest.id, *_ancestors(p)]
    return out


TOKENIZER = {"tokenizer.json": '{"vocab": {"0": 0, "1": 1}}', "tokenizer_config.json": "{}"}


def test_identical_tokenizer_from_an_edited_dataset_has_the_edited_dataset_as_parent(tmp_path):
    home = tmp_path / "home"
    store = ArtifactStore(home)
    a = store.put("dataset", "d", _folder(tmp_path, "a", {"train.jsonl": '{"prompt": "1+1=", "completion": "2"}\n'}),
                  run_id="run-a", parents=[], config={})
    tok_a = store.put("tokenizer", "t", _folder(tmp_path, "ta", TOKENIZER), run_id="run-a", parents=[a.id], config={})
    # The user edits the dataset; the tokenizer trained on it comes out byte-identical.
    b = store.put("dataset", "d", _folder(tmp_path, "b", {"train.jsonl": '{"prompt": "1+1=", "completion": "3"}\n'}),
                  run_id="run-b", parents=[], config={})
    tok_b = store.put("tokenizer", "t", _folder(tmp_path, "tb", TOKENIZER), run_id="run-b", parents=[b.id], config={})
    assert a.id != b.id and tok_b.id != tok_a.id
    assert store.manifest(tok_b).parents == [b.id] and store.manifest(tok_b).run_id == "run-b"
    assert store.manifest(tok_a).parents == [a.id] and store.manifest(tok_a).run_id == "run-a"  # untouched
    lineage_b = _ancestors(store.lineage(tok_b.id))
    assert lineage_b == [b.id] and a.id not in lineage_b
    assert _ancestors(store.lineage(tok_a.id)) == [a.id]
    assert store.verify(tok_a).id == tok_a.id and store.verify(tok_b).id == tok_b.id
    # ... and the tokenizer's files are on disk once: both artifacts hard-link one inode (plus the blob entry).
    fa, fb = store.get(tok_a) / "tokenizer.json", store.get(tok_b) / "tokenizer.json"
    sa, sb = fa.stat(), fb.stat()
    assert (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino) and sa.st_nlink == 3
    # The listing by run shows each run's own tokenizer.
    assert {m.id for m in store.list(run_id="run-b")} == {b.id, tok_b.id}
    # Same content, same parents, same kind: still the same artifact (what the stage caches rely on).
    again = store.put("tokenizer", "t2", _folder(tmp_path, "tb2", TOKENIZER), run_id="run-c", parents=[b.id],
                      config={})
    assert again.id == tok_b.id and store.manifest(again).run_id == "run-b"
    assert len(list((home / "objects").iterdir())) == 4 and fa.stat().st_nlink == 3
    # The order the parents are given in does not make another artifact; the manifest keeps the given order.
    m1 = store.put("model", "m", _folder(tmp_path, "m1", {"w": "x"}), run_id="r", parents=[b.id, tok_b.id], config={})
    m2 = store.put("model", "m", _folder(tmp_path, "m2", {"w": "x"}), run_id="r", parents=[tok_b.id, b.id], config={})
    assert m1.id == m2.id and store.manifest(m1).parents == [b.id, tok_b.id]
    # The same bytes as another kind are another artifact (before, the first put's kind stayed).
    as_eval = store.put("eval", "e", _folder(tmp_path, "e", {"w": "x"}), run_id="r", parents=[b.id, tok_b.id],
                        config={})
    assert as_eval.id != m1.id and store.manifest(as_eval).kind == "eval"


def test_data_prep_of_an_edited_file_gives_the_tokenizer_the_new_dataset(tmp_path):
    """End to end through the stage: a digits-only tokenizer trained on an edited file is byte-identical."""
    from posttrain import stages
    from posttrain.config import TokenizerConfig
    from posttrain.config.sections import DataConfig

    def write(path: Path, answers: list[int]) -> Path:
        path.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "completion": str(a)}) + "\n"
                                for i, a in enumerate(answers)))
        return path

    src = write(tmp_path / "train.jsonl", [2 * i for i in range(12)])
    store = ArtifactStore(tmp_path / "store")
    cfg = DataConfig(task="", files=[str(src)], eval_size=2, tokenizer=TokenizerConfig(train=True, vocab_size=300))
    first = stages.data_prep(cfg, require_completions=True, run_id="r1", store=store)
    write(src, [2 * i for i in range(11)] + [23])  # one answer edited
    second = stages.data_prep(cfg, require_completions=True, run_id="r2", store=store)
    assert first.dataset.id != second.dataset.id
    def files(ref):
        return {rel: meta["sha256"] for rel, meta in store.manifest(ref).files.items()}

    assert files(first.tokenizer) == files(second.tokenizer)  # byte-identical tokenizer ...
    assert _ancestors(store.lineage(second.tokenizer.id)) == [second.dataset.id]  # ... with the edited data
    assert _ancestors(store.lineage(first.tokenizer.id)) == [first.dataset.id]


def _spoil_garbage(p: Path) -> None:
    p.write_bytes(b"this is not an sqlite database\0\1\2" * 200)


def _spoil_empty(p: Path) -> None:
    p.write_bytes(b"")


def _new_db(p: Path, statement: str) -> None:
    """Replace the index with a fresh SQLite file holding only `statement`'s effect."""
    p.unlink()
    con = sqlite3.connect(p)
    con.execute(statement)
    con.commit()
    con.close()


def _spoil_no_table(p: Path) -> None:
    _new_db(p, "CREATE TABLE something_else (x INTEGER)")


def _spoil_old_schema(p: Path) -> None:
    _new_db(p, "CREATE TABLE artifacts (id TEXT PRIMARY KEY, kind TEXT)")  # the same name, other columns


def _spoil_marked_no_table(p: Path) -> None:
    """Marked complete but without the tables: the first query fails, the index is rebuilt and asked again."""
    _new_db(p, "PRAGMA user_version = 2")


def _spoil_stale(p: Path) -> None:
    """A valid index of this schema that lacks rows (e.g. written by older code, or by a writer that died)."""
    con = sqlite3.connect(p)
    con.execute("DELETE FROM artifacts")
    con.commit()
    con.close()


@pytest.mark.parametrize("spoil", [_spoil_garbage, _spoil_empty, _spoil_no_table, _spoil_old_schema,
                                   _spoil_marked_no_table],
                         ids=["garbage", "empty", "no-table", "old-schema", "marked-no-table"])
def test_a_broken_index_rebuilds_itself_from_the_manifests(tmp_path, spoil, capsys):
    home = tmp_path / "home"
    store = ArtifactStore(home)
    ds = store.put("dataset", "d", _folder(tmp_path, "d", {"a": "1"}), run_id="run-1", parents=[], config={})
    tok = store.put("tokenizer", "t", _folder(tmp_path, "t", {"a": "2"}), run_id="run-1", parents=[ds.id], config={})
    spoil(home / "index.sqlite")
    fresh = ArtifactStore(home)
    assert sorted(m.id for m in fresh.list()) == sorted([ds.id, tok.id])
    assert [m.id for m in fresh.list(kind="tokenizer")] == [tok.id]
    assert _ancestors(fresh.lineage(tok.id[:8])) == [ds.id]
    # writing into the store works too (the put used to fail after the object was already stored)
    model = fresh.put("model", "m", _folder(tmp_path, "m", {"a": "3"}), run_id="run-2", parents=[tok.id], config={})
    assert [m.id for m in ArtifactStore(home).list(run_id="run-2")] == [model.id]
    assert fresh.rebuild_index() == 3
    # the CLI shows them, with no traceback
    spoil(home / "index.sqlite")
    from posttrain.cli import store as cli

    capsys.readouterr()
    assert cli.main(["--home", str(home), "artifacts", "list", "--json"]) == 0
    assert sorted(m["id"] for m in json.loads(capsys.readouterr().out)) == sorted([ds.id, tok.id, model.id])


def test_index_rebuild_command_fixes_a_stale_index(tmp_path, capsys):
    """A stale index that is a valid one (rows missing) is not detected automatically; `index rebuild` fixes it."""
    from posttrain.cli import store as cli

    home = tmp_path / "home"
    store = ArtifactStore(home)
    ds = store.put("dataset", "d", _folder(tmp_path, "d", {"a": "1"}), run_id="run-1", parents=[], config={})
    _spoil_stale(home / "index.sqlite")
    assert ArtifactStore(home).list() == []
    assert cli.main(["--home", str(home), "index", "rebuild"]) == 0
    assert [m.id for m in ArtifactStore(home).list()] == [ds.id]
