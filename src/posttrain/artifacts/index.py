"""The lineage index: SQLite rows mirroring the manifests, for fast listing by kind and run.

It is only a cache of the manifests, which remain the source of truth, so it rebuilds itself whenever it
cannot be trusted: when the file is missing, is not an SQLite database (garbage bytes), is empty, lacks this
schema's tables or columns, or fails a query as damaged. A complete index carries `PRAGMA user_version =
_VERSION`, written in the same transaction as its rows, so a file that SQLite opens but this code did not
finish filling (0 bytes, another program's database, an older schema, a rebuild that died) reads as "not
built". A rebuild fills a new file beside the old one and renames it into place (atomic), so a concurrent
reader sees the old file or the complete new one, never a half-filled index. What it does not detect: a
well-formed index of this version that lacks rows (an artifact written by a writer that died between storing
the object and indexing it, or by another machine into a remote root) - `posttrain index rebuild` fixes that.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path

from posttrain.artifacts.manifest import Manifest

_SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (id TEXT PRIMARY KEY, kind TEXT, name TEXT, run_id TEXT, created TEXT);
CREATE TABLE IF NOT EXISTS parents (child TEXT, parent TEXT, PRIMARY KEY (child, parent));
CREATE INDEX IF NOT EXISTS by_run ON artifacts (run_id);
CREATE INDEX IF NOT EXISTS by_kind ON artifacts (kind);
"""
_VERSION = 2
"""`PRAGMA user_version` of a complete index of this schema (SQLite's default, 0, means not built by us)."""


def _busy(e: sqlite3.DatabaseError) -> bool:
    """Another writer holds the file (after the 30 s timeout): an error to report, not a damaged index."""
    return isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e))


class LineageIndex:
    def __init__(self, path: Path, rebuild: Callable[[], list[Manifest]]):
        self.path = Path(path)
        self._manifests = rebuild

    def _open(self, path: Path) -> sqlite3.Connection | None:
        """A connection to a complete index at `path`; None when there is none (missing, or not one we built).
        Raises sqlite3.DatabaseError for a file that is not a database."""
        if not path.exists():
            return None
        con = sqlite3.connect(path, timeout=30)
        try:
            if con.execute("PRAGMA user_version").fetchone()[0] == _VERSION:
                return con
        except BaseException:
            con.close()
            raise
        con.close()
        return None

    def _connect(self) -> sqlite3.Connection:
        try:
            con = self._open(self.path)
        except sqlite3.DatabaseError as e:  # "file is not a database", ...
            if _busy(e):
                raise
            con = None
        if con is None:
            self._build(force=False)
            con = sqlite3.connect(self.path, timeout=30)
        return con

    def _run(self, op: Callable[[sqlite3.Connection], object]):
        """`op` on a connection to the index; an index that fails as damaged is rebuilt and `op` run again."""
        for attempt in range(2):
            con = self._connect()
            try:
                return op(con)
            except sqlite3.DatabaseError as e:  # e.g. "no such column", "database disk image is malformed"
                if attempt or _busy(e):
                    raise
            finally:
                con.close()
            self._build(force=True)
        raise AssertionError("unreachable")

    def _build(self, *, force: bool) -> None:
        """Fill a new index from the manifests beside the old file and rename it into place. Unless `force`,
        a complete index that a concurrent process put there meanwhile is kept instead."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{uuid.uuid4().hex}.tmp")
        try:
            con = sqlite3.connect(tmp)
            try:
                con.executescript(_SCHEMA)
                with con:  # the rows and the "complete" mark in one transaction
                    self._fill(con, self._manifests())
                    con.execute(f"PRAGMA user_version = {_VERSION}")
            finally:
                con.close()
            if not force:
                try:
                    done = self._open(self.path)
                except sqlite3.DatabaseError:
                    done = None
                if done is not None:
                    done.close()
                    return
            for sidecar in ("-journal", "-wal", "-shm"):  # of the file being replaced: never apply to the new one
                Path(f"{self.path}{sidecar}").unlink(missing_ok=True)
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _fill(con: sqlite3.Connection, manifests: list[Manifest]) -> None:
        with con:
            for m in manifests:
                con.execute("INSERT OR REPLACE INTO artifacts VALUES (?, ?, ?, ?, ?)",
                            (m.id, m.kind, m.name, m.run_id, m.created))
                con.executemany("INSERT OR IGNORE INTO parents VALUES (?, ?)", [(m.id, p) for p in m.parents])

    def add(self, m: Manifest) -> None:
        self._run(lambda con: self._fill(con, [m]))

    def rebuild(self) -> int:
        """Rebuild the index from the manifests; returns the number of artifacts."""
        self._build(force=True)
        return self._run(lambda con: con.execute("SELECT COUNT(*) FROM artifacts").fetchone()[0])

    def ids(self, kind: str | None = None, run_id: str | None = None, child_of: str | None = None) -> list[str]:
        """Artifact ids, oldest first; filtered by kind, run and being made from the artifact `child_of`."""
        q, args = "SELECT id FROM artifacts WHERE 1=1", []
        if kind:
            q, args = q + " AND kind = ?", args + [kind]
        if run_id:
            q, args = q + " AND run_id = ?", args + [run_id]
        if child_of:
            q, args = q + " AND id IN (SELECT child FROM parents WHERE parent = ?)", args + [child_of]
        return self._run(lambda con: [r[0] for r in con.execute(q + " ORDER BY created, id", args)])
