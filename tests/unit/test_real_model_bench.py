"""bench/real_model.py's table of seeds from separate runs (`--rows-from`) and its task options: an earlier run's
rows join the table only when its command is this run's but for the seeds and where it kept its files."""

from __future__ import annotations

import importlib
import json
import shlex
import sys
from pathlib import Path

import pytest

BENCH = str(Path(__file__).resolve().parents[2] / "bench")

TRAIN_TASK = '{"name": "chain_sum", "min_terms": 2, "max_terms": 2}'
OVERRIDES = '{"rl": {"temperature": 0.7, "steps": 60}}'


@pytest.fixture(scope="module")
def real_model():
    """bench/real_model.py, imported with bench/ on sys.path only while this module's tests run (it imports
    default_seeds from there; bench's module names must not shadow anything for later tests)."""
    saved = list(sys.path)
    sys.path.insert(0, BENCH)
    try:
        yield importlib.import_module("real_model")
    finally:
        sys.path[:] = saved
        for name in ("real_model", "default_seeds", "rg_task"):
            sys.modules.pop(name, None)


def argv(seed: int, steps: int = 60, keep: str = "/tmp/k1") -> list[str]:
    return ["--seeds", str(seed), "--split", "held_out_first", "--keep", keep, "--train-task", TRAIN_TASK,
            "--overrides", OVERRIDES.replace("60", str(steps))]


def earlier_log(tmp_path: Path, seed: int, quoted: bool) -> Path:
    """What a run of this script prints: a JSON row per seed, then the table ending in its Command line (older
    runs printed the command unquoted, newer ones shell-quoted)."""
    args = argv(seed, keep="/tmp/k0")
    command = shlex.join(args) if quoted else " ".join(args)
    row = {"seed": seed, "wall_s": 3000.0, "sft_greedy_accuracy": 0.25, "rl_greedy_accuracy": 0.375,
           "d_greedy": 0.125, "folder_right": 0.25, "rl_right": 0.375}
    log = tmp_path / f"seed{seed}.log"
    log.write_text(f"train 872 validation 256 test 256\n{json.dumps(row)}\n| seed | ... |\n\nSmolLM2 ... (no question "
                   "in two splits); every figure is on the\ntest split, which ... Command: `.venv/bin/python "
                   f"bench/real_model.py {command}` (2026-11-27, commit abc1234; load average 2.00 2.00 2.00 at the "
                   "end).\n")
    return log


@pytest.mark.parametrize("quoted", [False, True])
def test_an_earlier_seed_of_the_same_command_joins_the_table(real_model, tmp_path, quoted):
    log = earlier_log(tmp_path, 0, quoted)
    mine = [*argv(1), "--rows-from", str(log), "--write-readme"]
    earlier = real_model.read_earlier(log, mine)
    assert [r["seed"] for r in earlier.rows] == [0]
    assert earlier.stamp == "2026-11-27, commit abc1234; load average 2.00 2.00 2.00 at the end"
    row = {"seed": 1, "wall_s": 2700.0, "sft_greedy_accuracy": 0.25, "rl_greedy_accuracy": 0.5, "d_greedy": 0.25,
           "folder_right": 0.25, "rl_right": 0.5}
    rg_task = sys.modules["rg_task"]
    block = real_model.table([row], mine, (2.0, 2.0, 2.0), rg_task.Sizes(2000, 256, 256), dict(rg_task.TASK),
                             json.loads(TRAIN_TASK), (earlier,))
    lines = block.splitlines()
    assert lines[2].startswith("| 0 | 0.250 | 0.375 | +0.125 |") and lines[3].startswith("| 1 | 0.250 | 0.500 |")
    assert "Greedy change mean +0.188 (min +0.125)" in block
    assert f"Seed 0 from an earlier run of the same command (its output: `{log}`; 2026-11-27" in block
    # the command shown is the one to paste: shell-quoted, without where this run kept its files or read rows from
    assert f"--train-task '{TRAIN_TASK}'" in block
    assert "--keep" not in block and "--rows-from" not in block and "--write-readme" not in block
    assert "the train questions from `chain_sum`" in block


def test_an_earlier_run_with_other_settings_is_refused(real_model, tmp_path):
    log = earlier_log(tmp_path, 0, quoted=True)
    with pytest.raises(SystemExit, match="options differ"):
        real_model.read_earlier(log, [*argv(1, steps=50), "--rows-from", str(log)])
    with pytest.raises(SystemExit, match="options differ"):
        real_model.read_earlier(log, [a for a in argv(1) if a not in ("--train-task", TRAIN_TASK)])


def test_output_that_is_not_this_scripts_is_refused(real_model, tmp_path):
    log = tmp_path / "other.log"
    log.write_text("some other output\n")
    with pytest.raises(SystemExit, match="expected this script's output"):
        real_model.read_earlier(log, argv(1))


def test_a_seed_measured_twice_and_a_train_task_without_held_out_first_are_refused(real_model, tmp_path):
    log = earlier_log(tmp_path, 0, quoted=True)
    with pytest.raises(SystemExit, match="a seed measured twice"):
        real_model.main([*argv(0), "--rows-from", str(log)])
    with pytest.raises(SystemExit, match="needs --split held_out_first"):
        real_model.main(["--split", "train_first", "--train-task", TRAIN_TASK])


@pytest.mark.parametrize("text, match", [("{bad", "not JSON"), ('{"size": 3}', "a JSON object with a"),
                                         ('{"name": "chain_sum", "seed": 1}', "no size or seed")])
def test_task_specs_are_checked_before_anything_runs(real_model, text, match):
    with pytest.raises(SystemExit, match=match):
        real_model.task_spec("--train-task", text)


def test_drop_removes_flags_and_options_with_their_values(real_model):
    assert real_model._drop(["--seeds", "0", "1", "--keep", "/k", "--split", "x", "--write-readme"],
                            {"--write-readme"}, {"--seeds", "--keep"}) == ["--split", "x"]


def test_a_table_is_written_into_the_one_page_that_holds_its_block(real_model, tmp_path, monkeypatch):
    """bench's `--write-readme`: the block is replaced where it lives (README.md or docs/*.md), the rest of the page
    kept; a block in no page or in two is refused before anything is written."""
    seeds = sys.modules["default_seeds"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n")
    page = tmp_path / "docs" / "results.md"
    page.write_text("head\n<!-- t:begin -->\nold\n<!-- t:end -->\ntail\n")
    monkeypatch.setattr(seeds, "ROOT", tmp_path)
    assert seeds.write_block("new row", "<!-- t:begin -->", "<!-- t:end -->") == page
    assert page.read_text() == "head\n<!-- t:begin -->\nnew row\n<!-- t:end -->\ntail\n"
    with pytest.raises(SystemExit, match="found in none"):
        seeds.write_block("x", "<!-- u:begin -->", "<!-- u:end -->")
    (tmp_path / "README.md").write_text("<!-- t:begin -->\n<!-- t:end -->\n")
    with pytest.raises(SystemExit, match="README.md"):
        seeds.write_block("x", "<!-- t:begin -->", "<!-- t:end -->")
    assert "new row" in page.read_text()  # nothing written on a refusal


def test_a_greedy_only_table_leaves_the_sampled_columns_out(real_model):
    """bench/default_seeds.py on a recipe with eval.k 0 (the summary's sampled accuracy is -1, dropped when read):
    no sampled column or spread, the start model's accuracy without the environment first when measured."""
    seeds = sys.modules["default_seeds"]
    summary = ("Summary(run_id='r', sft_greedy_accuracy=0.4, sft_sampled_accuracy=-1.0, rl_greedy_accuracy=0.9, "
               "rl_sampled_accuracy=-1.0)")
    assert seeds.summary_accuracies(summary) == {"sft_greedy_accuracy": 0.4, "rl_greedy_accuracy": 0.9}
    row = {"seed": 0, "wall_s": 600.0, "start_greedy_alone": 0.005, **seeds.summary_accuracies(summary),
           "d_greedy": 0.5, "greedy_low": 0.42, "greedy_high": 0.57, "rl_greedy_alone": 0.0}
    block = seeds.table([row], ["--recipe", "r"], (1.0, 1.0, 1.0), workflow="agent_pipeline")
    head, _, first = block.splitlines()[:3]
    assert head == ("| seed | start model without the environment | SFT greedy | RL greedy | change greedy (95% paired "
                    "interval) | RL greedy without the environment | wall |")
    assert first == "| 0 | 0.005 | 0.400 | 0.900 | +0.500 (+0.420 to +0.570) | 0.000 | 10.0 min |"
    assert "sampled" not in block
