"""Write a docs table from benchmark outputs kept in bench/results/, without a new run: the markdown table a bench
script printed under its `## SECTION` heading, taken from each kept output as printed, one row block per file.

    .venv/bin/python bench/kept_tables.py --block trl_runs --section "trl:" \\
        bench/results/trl-2026-11-27.txt bench/results/trl-2026-11-28.txt --write-docs

Each file contributes the first table printed after a line starting with `## SECTION` (rows as printed), with a
first column naming the file and its load average (the script's own last "load average" line). Tables of several
files are merged when their headers agree, and refused when they do not. The block's text names every file, and
the command that measured them is each file's first `# ` line (a comment the kept output starts with) or the
bench named by --measured-by. Without --write-docs the table is printed only.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def section_table(path: Path, section: str) -> tuple[str, list[str]]:
    """(header line, rows) of the first markdown table after a `## {section}` line of a kept output."""
    lines = Path(path).read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"## {section}")), None)
    if start is None:
        raise SystemExit(f"{path}: no line starting with '## {section}'")
    i = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("|")), None)
    if i is None or not lines[i + 1].startswith("|---"):
        raise SystemExit(f"{path}: no markdown table after '## {section}' (line {start + 1})")
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return lines[i], rows


def load_average(path: Path) -> str:
    """The kept output's last 'load average ...' figures (the 1-minute one after the run), or '-'."""
    found = re.findall(r"load average (?:before [0-9. ]+, )?after ([0-9.]+)", Path(path).read_text())
    return found[-1] if found else "-"


def merged(files: list[Path], section: str) -> list[str]:
    """One table: a first column naming each file (with its load average after the run), then its rows."""
    header, out = None, []
    for f in files:
        head, rows = section_table(f, section)
        if header is not None and head != header:
            raise SystemExit(f"{f}: its table's columns differ from {files[0]}'s:\n{head}\n{header}")
        header = head
        label = f"`{f.name}` (load {load_average(f)})"
        out += [f"| {label} " + row for row in rows]
    cols = header.count("|") - 1
    return ["| kept output " + header, "|---" * (cols + 1) + "|", *out]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="kept outputs under bench/results/")
    ap.add_argument("--section", required=True, help="the heading the table follows, after '## ' (e.g. 'trl:')")
    ap.add_argument("--block", required=True, help="the docs block to write: <!-- BLOCK:begin --> ... :end -->")
    ap.add_argument("--measured-by", default="", help="the command that made the outputs, when they do not say")
    ap.add_argument("--write-docs", action="store_true", help="write the table into its block")
    args = ap.parse_args(argv)
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        ap.error(f"no such kept output: {missing}")
    lines = merged(args.files, args.section)
    print("\n".join(lines))
    if args.write_docs:
        from default_seeds import write_block

        said = {f.name: next((x[2:] for x in f.read_text().splitlines() if x.startswith("# ")), "") for f in args.files}
        made = "; ".join(f"`{name}`: {c}" for name, c in said.items() if c)
        if not made and not args.measured_by:
            ap.error("the kept outputs do not say what made them (no first '# ' line): give --measured-by")
        files = " ".join(str(f) for f in args.files)
        measured = f" --measured-by '{args.measured_by}'" if args.measured_by else ""
        by = "; ".join(x for x in (args.measured_by, made) if x)
        text = "\n".join([*lines, "", (f"Measured by {by}. "
                                       f"Table: `.venv/bin/python bench/kept_tables.py --block {args.block} --section "
                                       f"'{args.section}' {files}{measured} --write-docs`.")])
        print(f"wrote the table into "
              f"{write_block(text, f'<!-- {args.block}:begin -->', f'<!-- {args.block}:end -->')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
