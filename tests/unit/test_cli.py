"""The `posttrain` command as a user runs it (a subprocess): output into a pipe that closes early ends
quietly, and user errors print one line unless `--debug` asks for the traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.artifacts import ArtifactStore

POSTTRAIN = str(Path(sys.executable).parent / "posttrain")


def _store_with_big_listing(home: Path, tmp: Path) -> str:
    """A store whose `artifacts list --json` and `lineage --json` print far more than a pipe holds (64 KiB)."""
    store = ArtifactStore(home)
    src = tmp / "src"
    src.mkdir()
    (src / "train.jsonl").write_text("x\n")
    ref = store.put("dataset", "d", src, run_id="r", parents=[], config={"blob": "x" * 300_000})
    return ref.id


@pytest.mark.parametrize("command", [["artifacts", "list", "--json"], ["lineage", "ID", "--json"]])
@pytest.mark.parametrize("entry", [[POSTTRAIN], [sys.executable, "-m", "posttrain.cli.store"]])
def test_output_into_a_pipe_closed_early_ends_without_a_traceback(tmp_path, entry, command):
    """`posttrain ... | head -c 10`: the reader takes 10 bytes and goes away while the command still writes."""
    home = tmp_path / "home"
    art = _store_with_big_listing(home, tmp_path)
    argv = [*entry, "--home", str(home), *[art if c == "ID" else c for c in command]]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert len(proc.stdout.read(10)) == 10
    proc.stdout.close()  # the reader stops with more than 64 KiB still to come
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert err == "", err  # no BrokenPipeError traceback, no "Exception ignored" line


def _bad_data_eval(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """`posttrain eval` on data with a row that has no prompt: a DataValidationError, a user error."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "model.safetensors").write_bytes(b"not read: data prep fails first")
    data, held = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    data.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n" + json.dumps({"answer": "3"}) + "\n")
    held.write_text(json.dumps({"question": "2+2=", "answer": "4"}) + "\n")
    over = {"data": {"task": "", "files": [str(data)], "eval_files": [str(held)], "eval_size": 0,
                     "schema": "prompt_answer", "prompt_field": "question"}}
    return subprocess.run([POSTTRAIN, "--home", str(tmp_path / "home"), *extra, "eval", "--recipe", "small_instruct_cpu",
                           "--model", str(model),
                           "--overrides", json.dumps(over)], capture_output=True, text=True, timeout=120, check=False)


def test_user_errors_print_one_message_and_debug_shows_the_traceback(tmp_path):
    out = _bad_data_eval(tmp_path)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("posttrain: error: 1 problem(s) in the input data"), out.stderr
    assert "field 'question'" in out.stderr, out.stderr
    debug = _bad_data_eval(tmp_path, "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "DataValidationError" in debug.stderr


def test_a_bad_setting_prints_one_line_naming_it(tmp_path):
    out = subprocess.run([POSTTRAIN, "--home", str(tmp_path / "home"), "eval", "--model", "abc",
                          "--overrides", '{"rl": {"steps": -1}}'], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 1 and out.stderr == "posttrain: error: rl.steps: must be >= 1\n", out.stderr
    debug = subprocess.run([POSTTRAIN, "--home", str(tmp_path / "home"), "eval", "--debug", "--model", "abc",
                            "--overrides", '{"rl": {"steps": -1}}'], capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" in debug.stderr and "ConfigError: rl.steps: must be >= 1" in debug.stderr, debug.stderr
