"""bench/kept_tables.py: a docs table made from kept benchmark outputs takes the table printed under the named
section of each file, as printed, and refuses a missing section or files whose columns differ."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("kept_tables", Path(__file__).resolve().parents[2] / "bench" / "kept_tables.py")
kept_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kept_tables)  # a file of bench/, loaded without putting bench/ on sys.path

OUT = """# .venv/bin/python bench/rl.py --sections trl, 2026-11-27
noise | not a table
## placement: other section
| a | b |
|---|---|
| 9 | 9 |
## trl: tiny_cpu SFT model -> GRPO
| trainer | tokens/s |
|---|---|
| posttrain GRPO | 5543 |
| TRL GRPOTrainer | 3102 |
posttrain / TRL: x1.79
load average before 1.28 1.80 2.24, after 1.90 2.06 2.23; 2 CPUs
"""


def test_the_named_sections_rows_as_printed_one_block_per_file(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(OUT)
    b.write_text(OUT.replace("5543", "6674").replace("after 1.90", "after 0.50"))
    lines = kept_tables.merged([a, b], "trl:")
    assert lines[0] == "| kept output | trainer | tokens/s |" and lines[1] == "|---|---|---|"
    assert lines[2:] == ["| `a.txt` (load 1.90) | posttrain GRPO | 5543 |", "| `a.txt` (load 1.90) | TRL GRPOTrainer | 3102 |",
                         "| `b.txt` (load 0.50) | posttrain GRPO | 6674 |", "| `b.txt` (load 0.50) | TRL GRPOTrainer | 3102 |"]


def test_a_missing_section_or_different_columns_are_refused(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(OUT)
    b.write_text(OUT.replace("| trainer | tokens/s |", "| trainer | steps/s |"))
    with pytest.raises(SystemExit, match="no line starting with '## async:'"):
        kept_tables.merged([a], "async:")
    with pytest.raises(SystemExit, match="columns differ"):
        kept_tables.merged([a, b], "trl:")
