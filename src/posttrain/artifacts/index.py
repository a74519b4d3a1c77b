"""The lineage index: SQLite rows mirroring the manifests, for fast listing by kind and run.

It is only a cache: when the file is missing (or its schema is old) it is rebuilt from the manifests,
which remain the source of truth.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable

from posttrain.artifacts.manifest import Manifest

_SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (id TEXT PRIMARY KEY, kind TEXT, name TEXT, run_id TEXT, created TEXT);
CREATE TABLE IF NOT EXISTS parents (child TEXT, parent TEXT, PRIMARY KEY (child, parent));
CREATE INDEX IF NOT EXISTS by_run ON artifacts (run_id);
CREATE INDEX IF NOT EXISTS by_kind ON artifacts (kind);
"""


class LineageIndex:
    def __init__(self, path: Path, rebuild: Callable[[], list[Manifest]]):
        self.path = Path(path)
        self._manifests = rebuild

    def _connect(self) -> sqlite3.Connection:
        fresh = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path, timeout=30)
        con.executescript(_SCHEMA)
        if fresh:
            self._fill(con, self._manifests())
        return con

    @staticmethod
    def _fill(con: sqlite3.Connection, manifests: list[Manifest]) -> None:
        with con:
            for m in manifests:
                con.execute("INSERT OR REPLACE INTO artifacts VALUES (?, ?, ?, ?, ?)",
                            (m.id, m.kind, m.name, m.run_id, m.created))
                con.executemany("INSERT OR IGNORE INTO parents VALUES (?, ?)", [(m.id, p) for p in m.parents])

    def add(self, m: Manifest) -> None:
        con = self._connect()
        try:
            self._fill(con, [m])
        finally:
            con.close()

    def rebuild(self) -> int:
        """Drop the index and rebuild it from the manifests; returns the number of artifacts."""
        self.path.unlink(missing_ok=True)
        con = self._connect()
        try:
            return con.execute("SELECT COUNT(*) FROM artifacts").fetchone()[0]
        finally:
            con.close()

    def ids(self, kind: str | None = None, run_id: str | None = None) -> list[str]:
        q, args = "SELECT id FROM artifacts WHERE 1=1", []
        if kind:
            q, args = q + " AND kind = ?", args + [kind]
        if run_id:
            q, args = q + " AND run_id = ?", args + [run_id]
        con = self._connect()
        try:
            return [r[0] for r in con.execute(q + " ORDER BY created, id", args)]
        finally:
            con.close()
