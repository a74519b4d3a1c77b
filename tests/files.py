"""Writing small file trees for tests (artifact sources, store fixtures)."""

from __future__ import annotations

from pathlib import Path


def write_folder(tmp: Path, name: str, files: dict[str, str]) -> Path:
    """tmp/name holding `files` ({relative path: text}); returns the folder."""
    d = tmp / name
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d
