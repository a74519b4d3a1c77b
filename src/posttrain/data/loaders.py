"""Load user data files into raw rows with their location ("file:line N" / "file:row N").

A file that yields no rows at all (empty, blank lines only, a csv header alone, a table without rows) is a
problem naming it, not a silently smaller dataset.

jsonl is read line by line (exact line numbers; BOM and CRLF tolerated; undecodable bytes and bad JSON
reported per line). csv and parquet go through HF `datasets` (quoted fields with newlines, extra columns),
and a `save_to_disk` folder through `datasets.load_from_disk`. HF caches go to a temporary folder, never the
user's global cache.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

from posttrain.config import ConfigError, DataFormat
from posttrain.data.validation import Problems

_EXT = {".jsonl": DataFormat.JSONL, ".json": DataFormat.JSONL, ".parquet": DataFormat.PARQUET,
        ".csv": DataFormat.CSV}


def detect_format(path: Path, fmt: DataFormat) -> DataFormat:
    if fmt != DataFormat.AUTO:
        return fmt
    if path.is_dir():
        return DataFormat.SAVED
    if path.suffix.lower() not in _EXT:
        raise ConfigError(f"{path}: cannot tell the format from the extension {path.suffix!r}; set data.format to "
                         f"one of {[f.value for f in DataFormat if f != DataFormat.AUTO]}")
    return _EXT[path.suffix.lower()]


def iter_rows(files: list[str], fmt: DataFormat, problems: Problems, *,
              setting: str = "data.files") -> Iterator[tuple[str, dict]]:
    """(location, row) for every row of every file in `files` (the config `setting` that lists them);
    unreadable rows are recorded as problems."""
    if not files:
        problems.add(setting, None, "no data files given")
        return
    for name in files:
        path = Path(name)
        if not path.exists():
            problems.add(str(path), None, f"file or folder does not exist (listed in {setting})")
            continue
        file_fmt = detect_format(path, fmt)
        before, n_rows = len(problems.items), 0
        for where_row in _jsonl(path, problems) if file_fmt == DataFormat.JSONL else _hf(path, file_fmt, problems):
            n_rows += 1
            yield where_row
        if not n_rows and len(problems.items) == before:  # not "nothing left after filtering" later, unnamed
            header_only = file_fmt == DataFormat.CSV and _csv_lines(path.read_bytes()) == 1
            problems.add(setting, None, f"no rows in {path} ({'only a header line' if header_only else 'empty file'})")


def _csv_lines(raw: bytes) -> int:
    """Non-blank lines of a (UTF-8) csv file."""
    return sum(1 for t in raw.decode("utf-8", errors="replace").removeprefix("\ufeff").splitlines() if t.strip())


def _jsonl(path: Path, problems: Problems) -> Iterator[tuple[str, dict]]:
    raw = path.read_bytes()
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    for i, line in enumerate(raw.split(b"\n"), start=1):
        where = f"{path}:line {i}"
        try:
            text = line.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            problems.add(where, None, f"undecodable bytes (not UTF-8) at byte {e.start}")
            continue
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            problems.add(where, None, f"invalid JSON ({e.msg})")
            continue
        if not isinstance(row, dict):
            problems.add(where, None, f"expected a JSON object, got {type(row).__name__}")
            continue
        yield where, row


def _hf(path: Path, fmt: DataFormat, problems: Problems) -> Iterator[tuple[str, dict]]:
    import datasets

    datasets.disable_progress_bars()
    if fmt == DataFormat.CSV:
        raw = path.read_bytes()
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw[: e.start].count(b"\n") + 1
            problems.add(f"{path}:line {line}", None, f"undecodable bytes (not UTF-8) at byte {e.start}")
            return
        if _csv_lines(raw) <= 1:
            return  # no rows (the csv reader's own error says nothing useful): iter_rows names the file
    with tempfile.TemporaryDirectory(prefix="posttrain-hf-") as cache:
        try:
            if fmt == DataFormat.SAVED:
                ds = datasets.load_from_disk(str(path))
                if isinstance(ds, datasets.DatasetDict):
                    ds = ds["train"] if "train" in ds else next(iter(ds.values()))
            else:
                builder = {DataFormat.CSV: "csv", DataFormat.PARQUET: "parquet"}[fmt]
                kw = {"encoding": "utf-8-sig"} if fmt == DataFormat.CSV else {}
                ds = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache, **kw)
        except Exception as e:  # noqa: BLE001 - any parser failure becomes a named problem
            problems.add(str(path), None, f"cannot be read as {fmt.value}: {type(e).__name__}: {e}")
            return
        for i, row in enumerate(ds, start=1):
            yield f"{path}:row {i}", row
