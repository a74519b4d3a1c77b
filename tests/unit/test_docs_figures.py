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



KEPT = {  # generated block -> the kept outputs (bench/results/) its table was made from
    "default_seeds": ["default-seeds-2026-11-30-mask-dtype.txt"],
    "calculator_seeds": ["calculator-seeds-sft3000-2026-11-29.txt"],
    "guess_number_seeds": ["guess-number-seeds-cpu-2026-11-28.txt"],
    "agent_methods": ["guess-number-methods-cpu-2026-11-29.txt", "guess-number-methods2-cpu-2026-11-29.txt",
                      "guess-number-methods3-cpu-2026-11-29.txt"],
    "real_calculator": ["real-calculator-seed1-2026-11-29.txt"],
    "agent_vs_trl": ["agent-vs-trl-2026-11-29.txt"],
    "async_seeds": ["async-seeds-2026-11-29-after-trim.txt"],
    "async_placements": ["rl-async-30steps-2026-11-29.txt"],
    "async_real": ["rl-async-30steps-2026-11-29.txt"],
    "real_model": ["real-model-test-arith-seed0-2026-11-30.txt", "real-model-test-arith-seed1-2026-11-30.txt"],
    "real_model_sorting": ["real-model-test-sort-seed0-2026-11-30.txt", "real-model-test-sort-seed1-2026-12-01.txt"],
    "rl_sweep": ["real-model-rl-sweep-arith-2026-12-01.txt", "real-model-rl-sweep-sort-2026-12-01.txt"],
    "rlhf_seeds": ["rlhf-seeds-2026-11-30.txt"],
    "mismatch": ["mismatch-2026-11-30.txt"],
    "algorithms": ["algorithms-seed0-b.json", "algorithms-seed0-a.json", "algorithms-seeds12.json",
                   "algorithms-lora.json"],
    "ppo_seeds": ["ppo-seeds-2026-11-29-after-trim.txt"],
    "ppo_step_pairs": ["rl-ppo-pairs-2026-11-30.txt"],
    "dense_seeds": ["dense-seeds-2026-11-29.txt"],
    "rollout_engines": ["rollout-engines-2026-11-30.txt"],
    "trl_runs": ["trl-2026-11-27.txt", "trl-2026-11-28.txt", "trl-async-2plus1-2026-11-29.txt",
                 "trl-async-2plus1-after-trim-2026-11-29.txt", "trl-prompt-sharing-2026-11-30.txt"],
    "rl_engines": ["rl-engines-2026-11-30.txt"],
    "decode_step": ["decode-step-2026-11-30.txt"],
    "prompt_sharing": ["prompt-sharing-2026-11-30.txt"],
}
"""A script writes each block, and its run's output is kept: a block's measured values (numbers with three or more
decimals: accuracies, step seconds; gains and minutes are derived from them) must each be in one of these files,
to the block's rounding."""


def test_each_generated_blocks_figures_are_in_its_kept_output():
    results = ROOT / "bench" / "results"
    missing, unkept = {}, []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name, body in re.findall(r"^<!-- (\w+):begin -->$(.*?)^<!-- \1:end -->$", page.read_text(),
                                      re.DOTALL | re.MULTILINE):
            files = [results / f for f in KEPT.get(name, [])]
            if not files or not all(f.is_file() for f in files):
                unkept.append(f"{page.name}:{name}")
                continue
            kept = [float(x) for f in files for x in re.findall(r"\d+\.\d+", f.read_text())]
            rows = [line for line in body.splitlines() if line.startswith("|") and not line.startswith("|---")][1:]
            values = re.findall(r"(?<![\d.+-])(\d+\.(\d{3,}))(?![\d.])", " ".join(rows))  # (value, its decimals)
            lost = [v for v, d in values if not any(abs(x - float(v)) <= 0.5 * 10 ** -len(d) + 1e-9 for x in kept)]
            if lost:
                missing[f"{page.name}:{name}"] = lost[:10]
    assert not unkept, f"generated blocks whose run's output is not kept (KEPT names none, or a missing file): {unkept}"
    assert not missing, f"figures of a block that its kept outputs do not hold: {missing}"
