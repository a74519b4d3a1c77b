"""The dense objectives on the embedded default over several seeds: the dense table of docs/results.md comes from this script.

    .venv/bin/python bench/dense_seeds.py                       # seeds 0 1 2, tiny_cpu, a fresh store per seed
    .venv/bin/python bench/dense_seeds.py --seeds 0 --keep      # keep the store (printed) to look at the models
    .venv/bin/python bench/dense_seeds.py --write-readme        # also rewrite the docs' table with this run

For each seed s, in one fresh store (so the later workflows reuse the earlier ones' cached stages), with every
seed set to s (data generation and split, weight init, data orders, sampling - `data.seed`, `model.init_seed`,
`sft.seed`, `rl.seed`, `pairs.seed`, `dpo.seed`, `reward_model.seed`, `distill.seed`), through `pyflyte run`:

1. `pipeline` - `make run`'s job: data -> SFT -> eval -> GRPO -> eval. Its RL model is the distillation teacher.
2. `dpo_pipeline` - SFT and its eval are cache hits; pairs from the SFT model's own 4 samples of every train
   prompt (one right, one wrong answer per prompt that has both) -> DPO -> eval.
3. `reward_model_pipeline` - the same pairs (cached) -> a reward model on the SFT model's body -> pairwise
   accuracy on the held-out pairs (from the eval split's prompts).
4. `distill_pipeline` with `distill.teacher` = step 1's RL model: a freshly initialised student (the SFT
   model's architecture and init seed) distilled on the same sloppy demonstrations SFT imitates.

It prints one row per seed and writes, with `--write-readme`, the block between
`<!-- dense_seeds:begin -->` and `<!-- dense_seeds:end -->` in docs/results.md (the figures are never typed by hand).
Runs one workflow at a time: timings of two concurrent runs on 2 cores would be noise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ siblings
from default_seeds import _commit, write_block

ROOT = Path(__file__).resolve().parents[1]
SEEDED = ("data", "sft", "rl", "pairs", "dpo", "reward_model", "distill")


def seed_overrides(seed: int, extra: dict | None = None) -> dict:
    over = {s: {"seed": seed} for s in SEEDED}
    over["model"] = {"init_seed": seed}
    for section, fields in (extra or {}).items():
        over.setdefault(section, {}).update(fields)
    return over


def pyflyte(workflow: str, overrides: dict, home: Path) -> tuple[str, float]:
    env = {**os.environ, "POSTTRAIN_HOME": str(home), "WANDB_MODE": "disabled"}
    cmd = [str(Path(sys.executable).parent / "pyflyte"), "run", "workflows/pipeline.py", workflow,
           "--overrides", json.dumps(overrides)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{workflow} failed (exit {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}")
    return out.stdout, time.perf_counter() - t0


def accuracies(stdout: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"(\w+_accuracy)=([-0-9.]+)", stdout)}


def run_seed(seed: int, home: Path, extra: dict) -> dict:
    over = seed_overrides(seed, extra)
    out, t_rl = pyflyte("pipeline", over, home)
    rl = accuracies(out)
    teacher = re.search(r"rl_model_id='([0-9a-f]{64})'", out).group(1)
    out, t_dpo = pyflyte("dpo_pipeline", over, home)
    dpo = accuracies(out)
    pairs = re.search(r"pairs: dataset \w+ \((\d+) train / (\d+) eval pairs", out)
    out, t_rm = pyflyte("reward_model_pipeline", over, home)
    pairwise = float(re.search(r"pairwise accuracy ([0-9.]+) on", out).group(1))
    kd_over = {**over, "distill": {**over["distill"], "teacher": teacher}}
    out, t_kd = pyflyte("distill_pipeline", kd_over, home)
    kd = accuracies(out)
    return {"seed": seed, "sft_greedy": rl["sft_greedy_accuracy"], "rl_greedy": rl["rl_greedy_accuracy"],
            "dpo_greedy": dpo["rl_greedy_accuracy"], "dpo_sampled": dpo["rl_sampled_accuracy"],
            "sft_sampled": rl["sft_sampled_accuracy"],
            "train_pairs": int(pairs.group(1)) if pairs else None, "eval_pairs": int(pairs.group(2)) if pairs else None,
            "rm_pairwise": pairwise, "student_greedy": kd["sft_greedy_accuracy"],
            "student_sampled": kd["sft_sampled_accuracy"],
            "wall_s": {"pipeline": t_rl, "dpo": t_dpo, "reward_model": t_rm, "distill": t_kd}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--overrides", default="{}", help="JSON merged into every seed's overrides")
    ap.add_argument("--keep", action="store_true", help="keep each seed's store (its path is printed)")
    ap.add_argument("--write-readme", action="store_true", help="replace the dense table (docs/results.md) with this run's")
    args = ap.parse_args(argv)
    extra = json.loads(args.overrides)
    rows = []
    for s in args.seeds:
        home = Path(tempfile.mkdtemp(prefix=f"posttrain-dense-seed{s}-"))
        rows.append(run_seed(s, home, extra))
        print(json.dumps(rows[-1]), flush=True)
        if args.keep:
            print(f"seed {s}: store {home}")
        else:
            subprocess.run(["rm", "-rf", str(home)], check=False)
    load = os.getloadavg()
    block = table(rows, argv if argv is not None else sys.argv[1:], load)
    print(block)
    if args.write_readme:
        print(f"wrote the table into {write_block(block, BEGIN, END)}")
    return 0


BEGIN, END = "<!-- dense_seeds:begin -->", "<!-- dense_seeds:end -->"


def table(rows: list[dict], argv: list[str], load: tuple[float, float, float]) -> str:
    lines = [("| seed | SFT greedy | DPO greedy (pairs) | reward model pairwise acc. (held-out pairs) "
              "| RL teacher greedy | distilled student greedy | wall: pipeline / DPO / RM / KD |"),
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        w = r["wall_s"]
        lines.append(f"| {r['seed']} | {r['sft_greedy']:.3f} | {r['dpo_greedy']:.3f} ({r['train_pairs']}) | "
                     f"{r['rm_pairwise']:.3f} ({r['eval_pairs']}) | {r['rl_greedy']:.3f} | {r['student_greedy']:.3f} | "
                     f"{w['pipeline'] / 60:.1f} / {w['dpo'] / 60:.1f} / {w['reward_model'] / 60:.1f} / "
                     f"{w['distill'] / 60:.1f} min |")
    command = " ".join(["bench/dense_seeds.py", *[a for a in argv if a != "--write-readme"]])
    lines += ["", (f"Greedy accuracy on the 500 held-out problems. DPO (SFT-regularised: `dpo.sft_weight` 1) starts "
                   f"from the SFT model and trains on pairs of its own samples; the reward model on the same pairs; the student is freshly initialised and "
                   f"distilled from the RL model on the sloppy demonstrations SFT imitates. Wall times are whole "
                   f"`pyflyte run`s, later ones reusing cached stages. Command: `.venv/bin/python {command}` "
                   f"({time.strftime('%Y-%m-%d')}, commit {_commit()}; load average {load[0]:.2f} {load[1]:.2f} "
                   f"{load[2]:.2f} at the end).")]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
