"""A warehouse's stock table as an environment with tools: the model is asked about a part and answers from what
the tools look up in `parts.csv` (part number, units in stock, shelf). The table lives only here, in the tool
process, so the model cannot know an answer without calling the right tool with the right part number.

Loaded by import path, never evaluated from a string: `rl.environment` / `eval.environment`
"warehouse:Warehouse" with `rl.episode.python_path` / `eval.episode.python_path` [this folder] (overrides.py
sets them). The conventions are TRL's `environment_factory` and OpenEnv's (docs/agents.md): every public, typed,
documented method is a tool the model sees in its system turn; `reset(**row)` gets the dataset row's fields it
names. The pipeline's verifier scores each episode's final answer against the row's reference answer.

This module's source sha256 keys the RL and eval caches and is in the RL model's lineage; parts.csv is not part
of it. After changing the table, run make_data.py: the demonstrations and reference answers change with it, so
the dataset and every stage after it are new.
"""

from __future__ import annotations

import csv
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "parts.csv"


def load_table(path: Path = TABLE) -> dict[str, dict]:
    """{part number: {"stock": int, "shelf": str}} from the CSV (columns part, stock, shelf)."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    table = {r["part"]: {"stock": int(r["stock"]), "shelf": r["shelf"]} for r in rows}
    if len(table) != len(rows):
        raise ValueError(f"{path}: a part number occurs twice")
    return table


class Warehouse:
    """Look up parts in the warehouse's stock table."""

    _table = load_table()  # read once per tool process, when the module is imported

    def _row(self, part: str) -> dict:
        row = self._table.get(part.strip())
        if row is None:  # the model reads this message as the tool's result (a failed call, counted)
            raise ValueError(f"no part {part!r} in the table; part numbers have four digits, e.g. '4821'")
        return row

    def stock(self, part: str) -> int:
        """How many units of a part are in stock.

        Args:
            part: The part number, four digits, e.g. "4821".
        """
        return self._row(part)["stock"]

    def shelf(self, part: str) -> str:
        """The shelf a part is stored on.

        Args:
            part: The part number, four digits, e.g. "4821".
        """
        return self._row(part)["shelf"]
