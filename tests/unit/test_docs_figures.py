"""Every table of measurements in the README and the docs is written by a script: it sits between the
`<!-- NAME:begin -->` and `<!-- NAME:end -->` markers a bench script's --write-readme / --write-docs replaces, and
that script names the block. Tables that describe (settings, methods, files) are listed in DESCRIPTIVE by their
header. A table of a run that is not repeated is written from its kept output by bench/kept_tables.py."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

GENERATED_PAGES = {"settings.md", "cli.md"}
"""Whole pages written by a generator (their own tests keep them current)."""

DESCRIPTIVE = {
    "| piece | where | what runs it |",
    "| method | shape | workflow | section | documented in |",
    "| file | what it holds | used by |",
    "| objective | what it minimises | frozen model | result |",
    "| `rl.algorithm` | advantage | policy objective | its own settings |",
    "| example | what it shows | tested by |",
}
"""Headers of tables that describe the code, not a measurement."""

def tables() -> list[tuple[str, str, bool]]:
    """(page, header line, inside a generated block) for every markdown table outside code fences."""
    out = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if page.name in GENERATED_PAGES:
            continue
        fence, block, prev = False, None, ""
        for line in page.read_text().splitlines():
            if line.startswith("```"):
                fence = not fence
            elif m := re.fullmatch(r"<!-- (\w+):(begin|end) -->", line):
                block = m.group(1) if m.group(2) == "begin" else None
            elif not fence and line.startswith("|") and not prev.startswith("|"):
                out.append((page.name, line.strip(), block is not None))
            prev = line
    return out


def test_every_measurement_table_is_written_by_a_script():
    found = tables()
    assert len(found) >= 20, found  # the parser sees the tables
    typed = [(p, h) for p, h, generated in found if not generated and h not in DESCRIPTIVE]
    assert not typed, ("tables of figures typed into the docs: put each between the markers of the bench script "
                       f"that writes it (`--write-readme` / `--write-docs`): {typed}")


def test_each_generated_block_names_the_script_that_writes_it():
    """A block's text names its command (`bench/NAME.py ...`), and that script exists."""
    blocks = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name, body in re.findall(r"^<!-- (\w+):begin -->$(.*?)^<!-- \1:end -->$", page.read_text(),
                                      re.DOTALL | re.MULTILINE):
            blocks[f"{page.name}:{name}"] = body
    assert len(blocks) >= 10, sorted(blocks)
    unnamed = {k: re.findall(r"bench/\w+\.py", body) for k, body in blocks.items()}
    bad = [k for k, scripts in unnamed.items() if not scripts or not all((ROOT / s).is_file() for s in scripts)]
    assert not bad, f"generated blocks that do not name an existing bench script as their command: {bad}"

