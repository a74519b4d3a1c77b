"""Every table of measurements in the README and the docs is written by a script: it sits between the
`<!-- NAME:begin -->` and `<!-- NAME:end -->` markers a bench script's --write-readme / --write-docs replaces, and
that script names the block. Tables that describe (settings, methods, files) are listed in DESCRIPTIVE by their
header; measurement tables still typed from a kept results file are listed in NOT_YET_WRITTEN with that file, and
an entry fails as stale once its table is gone or written by a script."""

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

NOT_YET_WRITTEN = {  # (page, header start) -> the command that measured it, as its page says
    ("agents.md", "| algorithm | SFT greedy / sampled |"):
        "bench/agent_inprocess.py (bench/results/guess-number-methods*-cpu-2026-11-29.txt)",
    ("async.md", "| placement (policy ranks + rollout threads"):
        "bench/rl.py --sections async (bench/results/rl-async-30steps-2026-11-29.txt)",
    ("async.md", "| placement | sync tok/s |"): "bench/rl.py --sections async, on SmolLM2",
    ("ppo.md", "| pair | GRPO step s |"): "bench/rl.py --sections ppo (2026-11-25, 8dbb515)",
    ("results.md", "| model, rollout batch |"): "bench/rollout_engines.py",
    ("results.md", "| run | trainer |"): "bench/rl.py --sections trl (bench/results/trl-2026-11-2*.txt)",
    ("results.md", "| model, recipe | engine |"): "bench/rl.py --sections engines (2026-11-24)",
    ("results.md", "| decoding | ms per step |"): "bench/decode_step.py",
}
"""Measurement tables typed from a kept output, to be written by their script (issue 48, item 4)."""


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
    typed = [(p, h) for p, h, generated in found if not generated and h not in DESCRIPTIVE
             and not any(p == page and h.startswith(start) for page, start in NOT_YET_WRITTEN)]
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


def test_the_list_of_tables_still_typed_is_not_stale():
    found = tables()
    stale = [key for key in NOT_YET_WRITTEN
             if not any(p == key[0] and h.startswith(key[1]) and not generated for p, h, generated in found)]
    assert not stale, f"NOT_YET_WRITTEN entries whose table is gone or now written by a script: {stale}"
