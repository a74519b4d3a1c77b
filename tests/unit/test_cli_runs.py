"""`posttrain runs`, `show` and `channels` on a real store with two small runs: text and --json output, run
status, one-line errors. (`promote`, which evaluates real models: tests/integration/test_promote_cli.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.artifacts import ArtifactStore
from posttrain.cli import main

POSTTRAIN = str(Path(sys.executable).parent / "posttrain")


def _put(store: ArtifactStore, tmp: Path, kind: str, name: str, run_id: str, parents: list[str], *,
         metrics: dict | None = None, extra: dict | None = None) -> str:
    """Store one tiny artifact whose single file names it (so every artifact has its own content)."""
    src = tmp / f"src-{run_id}-{name}"
    src.mkdir()
    (src / "data.json").write_text(json.dumps({"kind": kind, "name": name, "run": run_id}))
    return store.put(kind, name, src, run_id=run_id, parents=parents, config={"sft": {"steps": 3}},
                     metrics=metrics, extra=extra).id


@pytest.fixture
def home(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Run A: data -> tokenizer -> SFT -> eval, -> two RL checkpoints -> eval (complete). Run B, made later: data
    -> SFT -> eval, -> RL with no eval (partial). Returns the store root and the artifacts' ids by name."""
    home, store, ids = tmp_path / "home", ArtifactStore(tmp_path / "home"), {}
    ids["ds_a"] = _put(store, tmp_path, "dataset", "arith", "run-a", [], metrics={"num_train": 8})
    ids["tok_a"] = _put(store, tmp_path, "tokenizer", "arith-bpe64", "run-a", [ids["ds_a"]])
    ids["sft_a"] = _put(store, tmp_path, "model", "sft-arith", "run-a", [ids["ds_a"], ids["tok_a"]],
                        metrics={"loss": 0.25}, extra={"stage": "sft"})
    ids["sft_eval_a"] = _put(store, tmp_path, "eval", "eval-sft-arith", "run-a", [ids["sft_a"], ids["ds_a"]],
                             metrics={"greedy_accuracy": 0.4, "num_problems": 10})
    for step in (1, 2):
        ids[f"rl{step}_a"] = _put(store, tmp_path, "model", f"rl-step{step}", "run-a", [ids["sft_a"], ids["ds_a"]],
                                  extra={"policy_version": step, "step": step})
    ids["rl_eval_a"] = _put(store, tmp_path, "eval", "eval-rl-step2", "run-a", [ids["rl2_a"], ids["ds_a"]],
                            metrics={"greedy_accuracy": 0.6, "sampled_accuracy": 0.55, "pass_at_k": 0.8,
                                     "num_problems": 10})
    ids["ds_b"] = _put(store, tmp_path, "dataset", "arith-b", "run-b", [])
    ids["sft_b"] = _put(store, tmp_path, "model", "sft-arith-b", "run-b", [ids["ds_b"]], extra={"stage": "sft"})
    ids["sft_eval_b"] = _put(store, tmp_path, "eval", "eval-sft-arith-b", "run-b", [ids["sft_b"], ids["ds_b"]],
                             metrics={"greedy_accuracy": 0.3, "num_problems": 10})
    ids["rl_b"] = _put(store, tmp_path, "model", "rl-step1", "run-b", [ids["sft_b"], ids["ds_b"]],
                       extra={"policy_version": 1, "step": 1})
    return home, ids


def _cli(capsys, home: Path, *argv: str) -> tuple[int, str, str]:
    status = main(["--home", str(home), *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_runs_lists_each_run_newest_first_with_stages_status_and_accuracy(home, capsys):
    root, ids = home
    status, out, _ = _cli(capsys, root, "runs")
    assert status == 0
    b, a = out.split("\n\n")
    assert b.startswith("run run-b  partial (last stage: rl)") and "(4 artifacts)" in b
    assert a.startswith("run run-a  complete") and "(7 artifacts)" in a
    assert f"eval(rl)   {ids['rl_eval_a'][:12]}" in a and "greedy 0.6  sampled 0.55  pass@k 0.8  on 10 problems" in a
    assert f"rl         {ids['rl2_a'][:12]}  rl-step2" in a and "(2 checkpoints)" in a
    assert ids["rl1_a"][:12] not in a  # earlier RL checkpoints fold into the last one
    assert [line.split()[0] for line in a.splitlines()[1:]] == ["dataset", "tokenizer", "sft", "eval(sft)", "rl",
                                                               "eval(rl)"]

    status, out, _ = _cli(capsys, root, "runs", "--json", "--limit", "1")
    rows = json.loads(out)
    assert status == 0 and [r["run_id"] for r in rows] == ["run-b"]
    assert rows[0]["status"] == "partial (last stage: rl)" and rows[0]["wall_s"] >= 0
    assert [x["stage"] for x in rows[0]["artifacts"]] == ["dataset", "sft", "eval", "rl"]
    assert rows[0]["artifacts"][2]["model_stage"] == "sft" and rows[0]["artifacts"][2]["metrics"] == {
        "greedy_accuracy": 0.3, "num_problems": 10}


def test_show_prints_the_manifest_parents_files_and_metrics(home, capsys):
    root, ids = home
    status, out, _ = _cli(capsys, root, "show", ids["rl_eval_a"][:10])
    assert status == 0
    assert out.startswith(f"eval {ids['rl_eval_a'][:12]}  eval-rl-step2\n")
    assert f"  parents  {ids['rl2_a'][:12]}  rl        rl-step2  (run run-a)" in out
    assert f"           {ids['ds_a'][:12]}  dataset   arith  (run run-a)" in out
    assert "  config   sft.steps=3" in out and "  files    1 file, " in out
    assert "  result   greedy 0.6  sampled 0.55  pass@k 0.8  on 10 problems" in out
    assert "greedy_accuracy = 0.6" in out and "pass_at_k = 0.8" in out

    status, out, _ = _cli(capsys, root, "show", ids["sft_a"], "--json")
    doc = json.loads(out)
    assert status == 0 and doc["manifest"]["id"] == ids["sft_a"] and doc["manifest"]["metrics"] == {"loss": 0.25}
    assert [(p["kind"], p["name"]) for p in doc["parents"]] == [("dataset", "arith"), ("tokenizer", "arith-bpe64")]


def test_a_bad_id_is_a_one_line_error(home, capsys):
    root, _ = home
    status, out, err = _cli(capsys, root, "show", "zzzz")
    assert status == 1 and out == "" and err.startswith("posttrain: error: no artifact with id 'zzzz'")
    status, _, err = _cli(capsys, root, "promote", "zzzz", "production")
    assert status == 1 and err.startswith("posttrain: error: no artifact with id 'zzzz'") and "Traceback" not in err


def test_show_into_a_pipe_closed_early_ends_quietly(home):
    """`posttrain show ID --json | head -c 10` with far more than a pipe holds (64 KiB) still to come."""
    root, _ = home
    src = root.parent / "big"
    src.mkdir()
    (src / "x").write_text("x")
    big = ArtifactStore(root).put("dataset", "big", src, run_id="r", parents=[], config={"blob": "x" * 300_000}).id
    proc = subprocess.Popen([POSTTRAIN, "--home", str(root), "show", big, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert len(proc.stdout.read(10)) == 10
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert err == "", err


def test_show_html_writes_the_artifacts_page(home, capsys, tmp_path):
    root, ids = home
    status, out, _ = _cli(capsys, root, "show", ids["sft_a"][:12], "--html", str(tmp_path / "sft.html"))
    page = (tmp_path / "sft.html").read_text()
    assert status == 0 and out.startswith("model ") and page.lower().startswith("<!doctype html>")
    assert ids["sft_a"] in page and "holds no per-step history" in page  # the SFT page, of a model stored without
