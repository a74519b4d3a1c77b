"""The default recipe's RL gain over several seeds: the README's table comes from this script.

    .venv/bin/python bench/default_seeds.py                      # seeds 0 1 2, tiny_cpu, fresh store per run
    .venv/bin/python bench/default_seeds.py --seeds 0 1 2 3 --recipe tiny_cpu --overrides '{"rl": {"lr": 1e-4}}'
    .venv/bin/python bench/default_seeds.py --write-readme      # also rewrite the README's table with this run
    .venv/bin/python bench/default_seeds.py --recipe tiny_cpu_ppo --block ppo_seeds --write-readme   # PPO's table
    .venv/bin/python bench/default_seeds.py --workflow rlhf_pipeline --recipe tiny_cpu_rlhf --block rlhf_seeds
    .venv/bin/python bench/default_seeds.py --workflow agent_pipeline --recipe tiny_calculator --without-environment \
        --block calculator_seeds --write-readme                  # agentic RL: the calculator's table (docs/agents.md)

`--write-readme` replaces the block between `<!-- BLOCK:begin -->` and `<!-- BLOCK:end -->` (`--block`,
default `default_seeds`, in README.md; the others in the docs page that holds them: `write_block`) with this run's table, spread, command, commit and load average (the README figures are never typed by hand).

For each seed s it runs `make run`'s job (`pyflyte run workflows/pipeline.py pipeline`) in a subprocess with
every seed of the run set to s - data generation and split, weight init, SFT data order, RL prompt order and
sampling (`data.seed`, `model.init_seed`, `sft.seed`, `rl.seed`) - and reads the held-out accuracies from the
run's summary. It prints one row per seed and the mean, min and max of the RL change, greedy and sampled, so
a claimed gain comes with its spread. Evaluation settings (500 held-out problems, k=4 at T=1, eval seed 0)
stay fixed (a recipe with `eval.k` 0 is evaluated greedy only, and the table leaves the sampled columns out).
`--start-alone` also evaluates the recipe's start model, untrained, without the environment (agent_pipeline on a
pretrained folder: what the model could do before). Runs one seed at a time: timings of two concurrent runs on 2 cores would be noise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def seed_overrides(seed: int, extra: dict) -> dict:
    over = {"data": {"seed": seed}, "model": {"init_seed": seed}, "sft": {"seed": seed}, "rl": {"seed": seed}}
    for section, fields in extra.items():
        over.setdefault(section, {}).update(fields)
    return over


def run_pipeline(seed: int, recipe: str, extra: dict, home: Path, workflow: str = "pipeline",
                 what: str = "") -> tuple[dict, str]:
    """`pyflyte run workflows/pipeline.py WORKFLOW` with every seed = `seed` in store `home`: ({"seed", "wall_s",
    every *_accuracy it printed}, its stdout). A failed run ends the bench, naming `what` ran."""
    env = {**os.environ, "POSTTRAIN_HOME": str(home), "WANDB_MODE": "disabled"}
    cmd = [str(Path(sys.executable).parent / "pyflyte"), "run", "workflows/pipeline.py", workflow,
           "--recipe", recipe, "--overrides", json.dumps(seed_overrides(seed, extra))]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"seed {seed}{' ' + what if what else ''}: pipeline failed (exit {out.returncode}):\n"
                         f"{out.stdout[-3000:]}\n{out.stderr[-5000:]}")
    return {"seed": seed, "wall_s": wall, **summary_accuracies(out.stdout)}, out.stdout


def summary_accuracies(stdout: str) -> dict[str, float]:
    """Every `*_accuracy=X` of a run's printed summary, less those it did not evaluate (-1: a sampled accuracy
    with eval.k 0)."""
    return {k: float(v) for k, v in re.findall(r"(\w+_accuracy)=([-0-9.]+)", stdout) if float(v) >= 0}


def greedy_alone(seed: int, recipe: str, extra: dict, home: Path, model_id: str = "") -> float:
    """The held-out greedy accuracy of model `model_id` - "" for the recipe's own start model, untrained -
    evaluated WITHOUT the recipe's environment (one answer per problem, no tool to call), in the run's store
    (`eval_pipeline`; the data stage is cached)."""
    from posttrain.config import EpisodeConfig, to_dict

    plain = {"eval": {"environment": "", "tools": [], "episode": to_dict(EpisodeConfig())},
             "data": {"tokenizer": {"train": False}}}
    if model_id:  # the store's model instead of the recipe's start (a base_path recipe: the folder is its parent)
        plain["model"] = {"artifact": model_id, "base_path": ""}
    for section, fields in plain.items():
        extra = {**extra, section: {**extra.get(section, {}), **fields}}  # the model brings its tokenizer
    what = f"model {model_id[:12]}" if model_id else "the start model"
    _, out = run_pipeline(seed, recipe, extra, home, "eval_pipeline",
                          what=f"{what} evaluated without the environment")
    return float(re.search(r"eval \w+ of model \w+: greedy ([0-9.]+)", out)[1])


def run_seed(seed: int, recipe: str, extra: dict, home: Path, workflow: str = "pipeline",
             without_environment: bool = False, start_alone: bool = False) -> dict:
    """The run's accuracies, and the greedy change from the SFT model's eval to the RL model's, problem by
    problem on the same held-out problems (95% paired interval, McNemar's p: posttrain.eval.compare), read
    from the two eval reports in the run's store; with `without_environment`, also the RL model's greedy
    accuracy answering alone (`greedy_alone`); with `start_alone`, the recipe's start model's (before any
    training) the same way, after the run (so its data stage is cached)."""
    row, out = run_pipeline(seed, recipe, extra, home, workflow)
    ids = dict(re.findall(r"(\w+_eval_id)='([0-9a-f]{64})'", out))
    if without_environment:
        row["rl_greedy_alone"] = greedy_alone(seed, recipe, extra, home, re.search(r"rl_model_id='(\w+)'", out)[1])
    if start_alone:
        row["start_greedy_alone"] = greedy_alone(seed, recipe, extra, home)
    if "sft_eval_id" in ids and "rl_eval_id" in ids:
        from posttrain.artifacts import ArtifactStore
        from posttrain.eval import EvalReport
        from posttrain.eval.compare import paired_greedy

        store = ArtifactStore(str(home))
        sft, rl = (EvalReport.from_json((store.get(ids[k]) / "report.json").read_text())
                   for k in ("sft_eval_id", "rl_eval_id"))
        change = paired_greedy(rl, sft)
        if change is not None:
            row.update(greedy_low=change.low, greedy_high=change.high, greedy_p=change.p_value)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--recipe", default="tiny_cpu")
    ap.add_argument("--overrides", default="{}", help="JSON merged into every seed's overrides")
    ap.add_argument("--home", default="", help="artifact store to use (default: a fresh temporary one per seed); "
                    "'{seed}' in it is replaced by the seed, e.g. /data/stores/seed{seed}")
    ap.add_argument("--workflow", default="pipeline", help="pipeline (default) or rlhf_pipeline: any workflow "
                    "whose summary has SFT and RL accuracies")
    ap.add_argument("--without-environment", action="store_true", help="also evaluate the RL model without "
                    "the recipe's environment (agent_pipeline: what the task needs the tool for)")
    ap.add_argument("--start-alone", action="store_true", help="also evaluate the recipe's start model (e.g. "
                    "the pretrained folder) without the environment: what a user had before any training")
    ap.add_argument("--write-readme", action="store_true", help="replace the README's seed table with this run's")
    ap.add_argument("--block", default="default_seeds", help="the README block to replace (default_seeds, ppo_seeds)")
    args = ap.parse_args(argv)
    extra = json.loads(args.overrides)
    rows = []
    # a kept store that earlier runs filled: their stages are read back from its cache
    cached = bool(args.home) and any(Path(args.home.format(seed=s)).exists() for s in args.seeds)
    for s in args.seeds:
        with tempfile.TemporaryDirectory(prefix=f"posttrain-seed{s}-") as tmp:
            row = run_seed(s, args.recipe, extra, Path(args.home.format(seed=s)) if args.home else Path(tmp),
                           args.workflow, args.without_environment, args.start_alone)
        row["d_greedy"] = row["rl_greedy_accuracy"] - row["sft_greedy_accuracy"]
        if "rl_sampled_accuracy" in row and "sft_sampled_accuracy" in row:  # eval.k 0: greedy only
            row["d_sampled"] = row["rl_sampled_accuracy"] - row["sft_sampled_accuracy"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    load = os.getloadavg()
    print(f"\nrecipe {args.recipe}, overrides {json.dumps(extra)}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    block = table(rows, argv if argv is not None else sys.argv[1:], load, workflow=args.workflow,
                  cached=cached)
    print(block)
    if args.write_readme:
        page = write_block(block, f"<!-- {args.block}:begin -->", f"<!-- {args.block}:end -->")
        print(f"wrote the table into {page}")
    return 0


BEGIN, END = "<!-- default_seeds:begin -->", "<!-- default_seeds:end -->"


def table(rows: list[dict], argv: list[str], load: tuple[float, float, float], *, workflow: str = "pipeline",
          cached: bool = False) -> str:
    """The README block: one row per seed, the spread of the RL change, and how to reproduce it."""
    sampled = all("d_sampled" in r for r in rows)  # eval.k 0 evaluates greedy only
    columns = [("start model without the environment", lambda r: f"{r['start_greedy_alone']:.3f}",
                all("start_greedy_alone" in r for r in rows)),
               ("SFT greedy", lambda r: f"{r['sft_greedy_accuracy']:.3f}", True),
               ("SFT sampled", lambda r: f"{r['sft_sampled_accuracy']:.3f}", sampled),
               ("RL greedy", lambda r: f"{r['rl_greedy_accuracy']:.3f}", True),
               ("RL sampled", lambda r: f"{r['rl_sampled_accuracy']:.3f}", sampled),
               ("change greedy (95% paired interval)", lambda r: f"{r['d_greedy']:+.3f}" + (
                   f" ({r['greedy_low']:+.3f} to {r['greedy_high']:+.3f})" if "greedy_low" in r else ""), True),
               ("change sampled", lambda r: f"{r['d_sampled']:+.3f}", sampled),
               ("RL greedy without the environment", lambda r: f"{r['rl_greedy_alone']:.3f}",
                all("rl_greedy_alone" in r for r in rows)),
               ("wall", lambda r: f"{r['wall_s'] / 60:.1f} min", True)]
    columns = [(name, cell) for name, cell, shown in columns if shown]
    lines = ["| seed | " + " | ".join(name for name, _ in columns) + " |", "|---|" + "---|" * len(columns)]
    lines += [f"| {r['seed']} | " + " | ".join(cell(r) for _, cell in columns) + " |" for r in rows]
    spread = []
    for key, label in (("d_greedy", "greedy"), ("d_sampled", "sampled"))[:2 if sampled else 1]:
        v = [r[key] for r in rows]
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        spread.append(f"{label} mean {statistics.mean(v):+.3f} (min {min(v):+.3f}, max {max(v):+.3f}, std {sd:.3f})")
    command = " ".join(["bench/default_seeds.py", *[a for a in argv if a != "--write-readme"]])
    wall = (f"Wall time is the whole `pyflyte run {workflow}`" +
            (" with the stages it shares with earlier runs cached in the store" if cached else
             " in a fresh store (every stage) with the install done") +
            ("; `make run` is seed 0" if workflow == "pipeline" and "--recipe" not in argv else ""))
    paired = ("The greedy change's interval is paired: the SFT and the RL model answered the same held-out problems "
              "(Newcombe's interval for paired proportions, posttrain.eval.compare). " if any("greedy_low" in r for r in rows)
              else "")
    lines += ["", (f"RL change over the {len(rows)} seeds: {'; '.join(spread)}. {paired}{wall}. Command: "
                   f"`.venv/bin/python {command}` ({time.strftime('%Y-%m-%d')}, commit {_commit()}; load average "
                   f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end).")]
    return "\n".join(lines)


def write_readme(readme: Path, block: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace the README's block between the `begin` and `end` markers (each must occur once) with `block`."""
    text = readme.read_text()
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"{readme}: needs exactly one {begin} ... {end} block to replace")
    head, rest = text.split(begin)
    readme.write_text(head + begin + "\n" + block + "\n" + end + rest.split(end, 1)[1])


def write_block(block: str, begin: str = BEGIN, end: str = END) -> Path:
    """Replace the block between `begin` and `end` in the one page that holds it - README.md or a page under
    docs/ (tables live where a reader looks for them) - and return that page."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    holding = [p for p in pages if begin in p.read_text()]
    if len(holding) != 1:
        raise SystemExit(f"{begin}: expected in exactly one of README.md and docs/*.md, found in "
                         f"{[str(p.relative_to(ROOT)) for p in holding] or 'none'}")
    write_readme(holding[0], block, begin, end)
    return holding[0]


def _commit() -> str:
    out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                         check=False)
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
