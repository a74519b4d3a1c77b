"""The rollout/trainer mismatch table of docs/policy-gradient.md: the experiment of tests/unit/test_rl_mismatch.py,
run over seeds and written as a table.

    .venv/bin/python bench/mismatch.py                      # seeds 0 1, print the table
    .venv/bin/python bench/mismatch.py --seeds 0 1 2 --write-docs --out bench/results/mismatch-DATE.txt

Per seed, three runs of the test's tiny pretrained-like Llama (real rollout and policy workers in this process, a
gloo group of one rank) with the test's settings (CFG: 25 steps of 8 prompts x 4 samples, lr 1e-2, the reward the
share of even token ids): the rollout matched to the trainer; a rollout engine that samples from a copy of its
weights with relative Gaussian noise (SIGMA 3 x each tensor's std, drawn anew per version: KL 0.1-0.4 per token)
and no correction; the same with `rl.mismatch_correction: token_tis`. The figure is the mean reward of the last 8
steps. The test asserts matched >= 0.95, corrected >= 0.85 and corrected - uncorrected >= 0.15 on seeds 0 and 1;
this script is where the figures in the docs come from (`--write-docs` replaces the `mismatch` block).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
BEGIN, END = "<!-- mismatch:begin -->", "<!-- mismatch:end -->"
VARIANTS = ("matched", "perturbed", "perturbed+tis")


def measure(seeds: list[int]) -> dict[int, dict[str, float]]:
    """{seed: {variant: mean reward of the last 8 steps}}, each run as the test runs it."""
    from posttrain.config import MismatchCorrection
    from posttrain.spmd.dist import _free_port, init_distributed
    from tests.unit.conftest import build_folders
    from tests.unit.test_rl_mismatch import CFG, SIGMA, _late_reward, _run

    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    init_distributed()
    folders = build_folders(Path(tempfile.mkdtemp(prefix="mismatch-")))
    out = {}
    for seed in seeds:
        cfg = replace(CFG, seed=seed)
        runs = {"matched": (0.0, MismatchCorrection.OFF), "perturbed": (SIGMA, MismatchCorrection.OFF),
                "perturbed+tis": (SIGMA, MismatchCorrection.TOKEN_TIS)}
        out[seed] = {name: _late_reward(_run(folders, replace(cfg, mismatch_correction=mode), sigma))
                     for name, (sigma, mode) in runs.items()}
        print(seed, out[seed], flush=True)
    return out


def table(results: dict[int, dict[str, float]], command: str) -> str:
    seeds = sorted(results)
    rows = {"matched": "matched", "perturbed": "perturbed, no correction", "perturbed+tis": "perturbed, token TIS"}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False).stdout.strip()
    lines = [f"| rollout | mean reward of the last 8 of 25 steps, seeds {' / '.join(map(str, seeds))} |",
             "|---|---|"]
    lines += [f"| {label} | {' / '.join(f'{results[s][key]:.3f}' for s in seeds)} |" for key, label in rows.items()]
    load = os.getloadavg()
    lines += ["", (f"Made by `.venv/bin/python {command}` (commit {commit}, {time.strftime('%Y-%m-%d')}, load "
                   f"average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}).")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--write-docs", action="store_true", help="replace the mismatch block of the docs")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here (bench/results/...)")
    args = ap.parse_args(argv)
    block = table(measure(args.seeds),
                  " ".join(["bench/mismatch.py", *[a for a in argv if a != "--write-docs"]]))
    print(block)
    if args.out is not None:
        args.out.write_text(block + "\n")
    if args.write_docs:
        from default_seeds import write_block

        print(f"wrote the table into {write_block(block, BEGIN, END)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
