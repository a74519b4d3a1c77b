"""A real model made better? RL with LoRA on SmolLM2-135M-Instruct, on a task built from a third-party package.

    make real-model
    .venv/bin/python bench/real_model.py                    # seeds 0 1, recipe small_instruct_lora_cpu, arithmetic
    .venv/bin/python bench/real_model.py --seeds 0 --reward raw --split held_out_first
    .venv/bin/python bench/real_model.py --family spelling  # reasoning-gym spell_backward, reward `word`
    .venv/bin/python bench/real_model.py --validation-n 256 --eval 256 --train 2000   # the split sizes (defaults)
    .venv/bin/python bench/real_model.py --write-readme     # also rewrite the family's block in docs/lora.md
    .venv/bin/python bench/real_model.py --task '{"name": "basic_arithmetic", "max_terms": 2, "max_digits": 2}'
    .venv/bin/python bench/real_model.py --seeds 1 ... --rows-from seed0.log --write-readme  # a seed per run, one table
    .venv/bin/python bench/real_model.py --recipe small_instruct_sft_rl_cpu --family sorting --split held_out_first \
        --seeds 0 --on validation                           # SFT on the train rows, then RL; scored on validation
    .venv/bin/python bench/real_model.py --recipe small_instruct_sft_rl_cpu --split held_out_first --seeds 1 \
        --against-no-selection    # then the recipe without pass-rate selection at equal wall time, same store

What it does, as a user would with their own model, data and scorer (the task's pieces live in bench/rg_task.py):
1. installs reasoning-gym (PyPI, pinned) with `pip install --target` into `<cache>/reasoning-gym/<version>`,
   never into `.venv`;
2. builds the task with it, in three splits with no question in two of them: train (`--train` generated rows),
   validation (`--validation-n`, default 256) and test (`--eval`, default 256). Sweeps and recipe choices read the
   validation split only (bench/real_model_sweep.py); every figure this script reports is on the test split, and
   its table says so. `--split train_first`: validation and test are later distinct questions not in train;
   `held_out_first`: they are the task's own mix and train is the rest. Each held-out question goes to validation or
   test by a hash of its text (bench/rg_task.split_questions), so the two splits are the same mix. Until 2026-11-30
   validation was dealt first: it held the held-out set of the runs before the three splits, and chain_sum's
   2-term questions were 110 of its 256 against 57 of test's; the figures below, and those of earlier test runs,
   are on those older splits. The task is the family's (`--family`): `arithmetic` (default) is `chain_sum` problems (`State
   the final answer to the following arithmetic problem: 6 + 0 - 1 =`), 2 or 3 one-digit terms; `spelling` is
   `spell_backward` (`Spell this word backward (example: sun -> nus): ward`, answer `draw`), words of 3-5 letters,
   a task of another kind with a short answer reasoning-gym's scorer checks (the recipe is not tuned to it). Each
   row keeps reasoning-gym's own `metadata`; `--task` names another reasoning-gym dataset and its config
   (bench/task_probe.py says what the model can already do on one); `--train-task` takes the train questions from
   another config (with `--split held_out_first`: validation and test stay `--task`'s own mix, and no train
   question is in either);
3. writes the reward (`rg_reward:score`, `--reward`, default the family's first): reasoning-gym's own scorer for
   the row (`get_score_answer_fn(metadata["source_dataset"])`), given the completion's last number (`number`,
   arithmetic's), its last word (`word`, spelling's: a run of letters and digits, so "is 'draw'." reads draw;
   spell_backward's scorer ignores case and gives a right prefix partial credit) or the completion as it is
   (`raw`: 1.0 only for exactly the answer, `len(answer) / len(completion)` for an answer inside other words -
   "The answer is 8." scores 0.06; `shaped`: half of number and raw, so only the bare answer scores 1.0 and a right
   number inside a sentence about half); a reward that cannot read the family's answers is refused; evaluation
   counts a score >= 1.0 as correct;
4. runs `pyflyte run workflows/pipeline.py pipeline` from the SmolLM2 folder with `--recipe` (SFT as the recipe
   has it: small_instruct_lora_cpu runs RL straight from the folder, small_instruct_sft_rl_cpu trains LoRA SFT on
   the train rows' answers first, then selects prompts by pass rate and runs RL), one seed at a time, each in a
   fresh store, evaluating on the test split (`--on validation`: the validation split, for choosing a recipe; such
   a table is never written into the docs), and reads the greedy accuracy of the folder (with SFT: evaluated alone
   after the run, `eval_pipeline`), of the SFT model and of the RL model, and the paired 95% interval of each
   change over the same problems;
5. with `--against-no-selection` (a recipe that selects prompts by pass rate): runs the recipe again in the same
   store without the selection (SFT and its evaluation are cached), its RL given the selection's measured seconds
   (the selection dataset's `seconds`) as extra steps at the first run's mean step time, so selection + RL and RL
   alone take the same wall time; prints both RL models' greedy accuracy on the same test problems and the paired
   difference with its 95% interval (selection's gain, whichever way it falls);
6. reads both evaluations' greedy completions back from the store and counts how often the completion's answer,
   read as the family's reward reads it, is the answer ("arithmetic right": the last number; "word right": the
   last word, case ignored), whatever the wording, so a gain in the scorer's accuracy can be told apart into
   saying the answer as asked and getting it right.

Measured before the three splits (their held-out set is what the validation split now holds; figures on the test
split are to be re-made). 2026-11-26 (bench/results/real-model-2026-11-26.txt): at first NOT made better. Seed 0 with
the defaults (30 steps of 8 prompts x 8 samples, LoRA rank 16 at lr 3e-4, the policy rank generating): held-out greedy
0.129 -> 0.137 on 256 problems (+0.008) in 26.4 min. `--reward raw --split held_out_first` (20 steps): greedy
0.000 before; the mean reward stayed at 0.002-0.008 for 7 steps (the model answers "The answer is 5." and a
bare number is rare enough that the partial credit barely moves it), stopped there. 2 terms of 1-2 digits:
greedy 0.027 before RL (the model cannot add two-digit numbers), stopped after the evaluation.
`--split held_out_first` (the task's own mix: 110 two-term and 146 three-term problems held out), folder greedy
0.227: with rollouts at temperature 0.5 (`--overrides '{"rl": {"temperature": 0.5}}'`; sampled accuracy 0.19
and pass@8 0.53 before RL) the train accuracy stayed at 0.13 on average over 19 steps while the entropy fell
0.45 -> 0.12, stopped there; `--reward shaped` at temperature 0.8: no completion was exactly the answer in 9
steps and the responses grew longer, stopped there. With both settings `bench/real_model_sweep.py` ranked first
at step 10 on a GPU, `--split held_out_first --overrides '{"rl": {"temperature": 0.7, "kl_coef": 0.05, "steps":
50}}'`: 0.227 -> 0.289 (+0.062) for seed 0 in 50.5 min, 0.227 -> 0.258 (+0.031) for seed 1 in 48.2 min - the first
gains on this model, not yet the >= 0.10 asked. 60 steps with `"model": {"gradient_checkpointing": false}` too
(~50 s a step): +0.094 for seed 0 in 51.9 min, +0.059 for seed 1 in 47.9 min. Per-step figures: the results file.
2026-11-27 (bench/results/real-model-2026-11-27.txt), seed 0: `"kl_coef": 0.0` with 100 steps (19 s a step: no
reference pass, and the update skips the rows without a gradient) collapsed the policy, 0.227 -> 0.191 (-0.035) in
35.6 min; `"algorithm": "dapo", "max_extra_draws": 0` with the KL kept (28 s a step) drifted from the base (KL
0.3-0.96) and was stopped after 46 steps. **Made better**: the same recipe as the 60-step runs, trained on the 2-term
questions (`--train-task '{"name": "chain_sum", "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}'`;
the held-out set unchanged): 0.227 -> 0.367 (+0.141) for seed 0 in 50.4 min and for seed 1 in 46.2 min, 2-term
problems 0.418 -> 0.764 / 0.727, 3-term 0.082 -> 0.068 / 0.096 (the table of docs/lora.md, written by this script).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from default_seeds import _commit, greedy_alone, run_pipeline, write_block
from rg_task import CACHE, FAMILIES, REWARDS, RG_VERSION, Family, Sizes, build_task, check_split, install_reasoning_gym
from run_store import answers_right, evaluations, keep_run, paired, progress_lines
from selection_vs_none import against_no_selection, selection_table

MODEL = CACHE / "models" / "SmolLM2-135M-Instruct"


def markers(family: str) -> tuple[str, str]:
    """The generated block a family's table goes in: `real_model` (arithmetic), else `real_model_<family>`."""
    name = "real_model" if family == "arithmetic" else f"real_model_{family}"
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


ON_TEST = "every figure is on the test split"
ON_VALIDATION = "every figure is on the validation split, for choosing a recipe; never reported as a result"
"""Written into the table's text; `--rows-from` refuses the output of a run whose table does not say it."""


def overrides(task: dict, extra: dict) -> dict:
    """The run's overrides: the folder, the task's data and reward, then `--overrides`; SFT as the recipe has it."""
    over = {"model": {"base_path": str(MODEL)}, **json.loads(json.dumps(task))}
    for section, fields in extra.items():
        over.setdefault(section, {}).update(fields)
    return over


def table(rows: list[dict], argv: list[str], load: tuple[float, float, float], sizes: Sizes, spec: dict,
          train_spec: dict | None = None, earlier: tuple[Earlier, ...] = (), family: str = "arithmetic",
          on: str = "test") -> str:
    """The docs block: one row per seed on the test split (sampled accuracy only when the recipe's eval.k > 0), the
    change, and how to reproduce it; the seeds of `earlier` runs (`--rows-from`) first, each named with its own
    command."""
    fam = FAMILIES[family]
    rows = [r for run in earlier for r in run.rows] + rows
    sampled = all(r.get("sft_sampled_accuracy", -1.0) >= 0 for r in rows)
    sft = any("folder_greedy" in r for r in rows)  # the recipe ran SFT: the summary's "sft" is the SFT model
    interval = all("greedy_low" in r for r in rows)
    head = (["seed", "folder greedy"] + (["SFT greedy"] if sft else []) + ["RL greedy"]
            + ["change greedy" + (" (95% paired interval)" if interval else "")]
            + (["RL over SFT (95% paired interval)"] if sft and interval else [])
            + (["folder sampled", "RL sampled"] if sampled else []) + [f"folder {fam.right}", f"RL {fam.right}"])
    lines = ["| " + " | ".join(head + ["wall"]) + " |", "|" + "---|" * (len(head) + 1)]
    for r in rows:
        folder = r.get("folder_greedy", r["sft_greedy_accuracy"])
        cells = [str(r["seed"]), f"{folder:.3f}"] + ([f"{r['sft_greedy_accuracy']:.3f}"] if sft else [])
        cells += [f"{r['rl_greedy_accuracy']:.3f}", f"{r['d_greedy']:+.3f}" + (
            f" ({r['greedy_low']:+.3f}, {r['greedy_high']:+.3f})" if interval else "")]
        if sft and interval:
            cells.append(f"{r['rl_greedy_accuracy'] - r['sft_greedy_accuracy']:+.3f} "
                         f"({r['over_sft_low']:+.3f}, {r['over_sft_high']:+.3f})")
        if sampled:
            cells += [f"{r['sft_sampled_accuracy']:.3f}", f"{r['rl_sampled_accuracy']:.3f}"]
        cells += [f"{r['folder_right']:.3f}", f"{r['rl_right']:.3f}"]
        lines.append("| " + " | ".join(cells + [f"{r['wall_s'] / 60:.1f} min"]) + " |")
    g = [r["d_greedy"] for r in rows]
    command = shlex.join(["bench/real_model.py", *_drop(argv, {"--write-readme"}, {"--rows-from", "--keep"})])
    before = "".join(f" Seed{'s' if len(run.rows) > 1 else ''} {', '.join(str(r['seed']) for r in run.rows)} from an "
                     f"earlier run of the same command (its output: `{run.log}`; {run.stamp})." for run in earlier)
    task = json.dumps({k: v for k, v in spec.items() if k != "name"})
    trained_on = ("" if train_spec is None else f"; the train questions from `{train_spec['name']}` "
                  f"({json.dumps({k: v for k, v in train_spec.items() if k != 'name'})})")
    lines += ["", (f"SmolLM2-135M-Instruct, reasoning-gym {RG_VERSION} `{spec['name']}` ({task}; family {family}), "
                   f"{sizes.train} generated train / {sizes.validation} validation / {sizes.test} test questions (no "
                   f"question in two splits{trained_on}); "
                   + (f"{ON_TEST}, which no sweep or recipe choice reads (bench/real_model_sweep.py and `--on "
                      f"validation` score on the validation split)" if on == "test" else ON_VALIDATION)
                   + f". Greedy change mean "
                   f"{statistics.mean(g):+.3f} (min {min(g):+.3f}), RL model against the folder"
                   f"{'; the SFT model is the SFT stage of the recipe on the train rows, which RL starts from' if sft else ''}"
                   f"{f'; intervals are paired over the {on} problems (Newcombe; posttrain.eval.compare)' if interval else ''}"
                   f". Greedy is the scorer's accuracy (a score of 1.0); "
                   f"\"{fam.right}\" counts {fam.rule}, however worded. Wall is the whole `pyflyte run` in a fresh "
                   f"store: both evaluations and every RL step. Command: `.venv/bin/python {command}` "
                   f"({time.strftime('%Y-%m-%d')}, commit {_commit()}; load average {load[0]:.2f} {load[1]:.2f} "
                   f"{load[2]:.2f} at the end).{before}")]
    return "\n".join(lines)


@dataclass(frozen=True)
class Earlier:
    """Seeds measured by an earlier run of this script, read back from its saved output (`--rows-from`)."""

    log: str
    rows: list[dict]
    stamp: str  # "DATE, commit C; load average ... at the end", as that run printed it


def _drop(argv: list[str], flags: set[str], with_values: set[str]) -> list[str]:
    """argv without `flags` and without the options in `with_values` and their values (`--seeds` takes several)."""
    out, skip = [], False
    for a in argv:
        if skip and not a.startswith("--"):
            continue
        skip = a in with_values
        if not skip and a not in flags:
            out.append(a)
    return out


def read_earlier(log: Path, argv: list[str]) -> Earlier:
    """The per-seed rows an earlier run printed, refused unless its figures are on the test split and its command is
    this one's but for the seeds and where it kept its files (the table would mix two recipes or two splits)."""
    text = log.read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.startswith('{"seed": ')]
    found = re.findall(r"Command: `\.venv/bin/python bench/real_model\.py (.*?)` \((.*?)\)\.", text, re.DOTALL)
    if not rows or len(found) != 1:
        raise SystemExit(f"--rows-from {log}: expected this script's output (its JSON rows and one Command line)")
    if ON_TEST not in text.replace("\n", " "):
        raise SystemExit(f"--rows-from {log}: its table does not say {ON_TEST!r} (a run from before the train / "
                         "validation / test splits: its held-out set is now the validation split)")
    # compared as words: an older run printed its command unquoted, a newer one shell-quoted (JSON has no ')
    theirs = found[0][0].replace("\n", " ").replace("'", "").split(" --")
    mine = " ".join(_drop(argv, {"--write-readme"}, {"--rows-from"})).split(" --")
    skip = ("--seeds", "seeds", "keep", "against-no-selection")  # the last adds a second run; the rows are the same
    same = sorted(o for o in theirs if not o.startswith(skip))
    if same != sorted(o for o in mine if not o.startswith(skip)):
        raise SystemExit(f"--rows-from {log}: its run's options differ from this one's:\n  {' --'.join(theirs)}\n"
                         f"  {' --'.join(mine)}")
    return Earlier(str(log), rows, found[0][1].replace("\n", " "))


def task_spec(option: str, text: str) -> dict:
    """A reasoning-gym dataset spec from the command line, checked before anything is installed or run."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"{option}: not JSON ({e}): {text!r}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or {"size", "seed"} & set(spec):
        raise SystemExit(f"{option}: expected a JSON object with a \"name\" and no size or seed, got {text!r}")
    return spec


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--recipe", default="small_instruct_lora_cpu")
    ap.add_argument("--overrides", default="{}", help="JSON merged into every seed's overrides")
    ap.add_argument("--family", choices=sorted(FAMILIES), default="arithmetic",
                    help="arithmetic: chain_sum, the last number scored; spelling: spell_backward, the last word "
                    "scored (the default --task and --reward, and what the table's 'right' column reads)")
    ap.add_argument("--task", default=None, help='reasoning-gym dataset as JSON: {"name": ..., its config fields} '
                    "(size and seed are set here; default: the family's)")
    ap.add_argument("--train-task", default=None,
                    help="reasoning-gym dataset as JSON for the train questions only (--split held_out_first): "
                    "validation and test stay --task's own mix, and no train question is in either")
    ap.add_argument("--train", type=int, default=2000, help="generated train questions (held-out ones dropped)")
    ap.add_argument("--validation-n", type=int, default=256,
                    help="validation questions: what bench/real_model_sweep.py scores on; never reported here")
    ap.add_argument("--eval", type=int, default=256, help="test questions: every figure this script reports")
    ap.add_argument("--on", choices=("test", "validation"), default="test",
                    help="the split evaluated: test (reported figures) or validation (choosing a recipe: such a table "
                    "is never written into the docs nor joins a test table)")
    ap.add_argument("--reward", choices=sorted(REWARDS), default=None,
                    help="number: the completion's last number, scored; word: its last word, scored; shaped: half "
                    "each of number and raw; raw: the completion as it is, scored (default: the family's first)")
    ap.add_argument("--split", choices=("train_first", "held_out_first"), default="train_first",
                    help="train_first: validation and test questions are later ones not in train; held_out_first: "
                    "validation and test are the task's own mix, train is the rest")
    ap.add_argument("--keep", type=Path, default=None,
                    help="copy each seed's steps.jsonl and evaluation reports into KEEP/seed<N>/")
    ap.add_argument("--rows-from", type=Path, nargs="+", default=[],
                    help="the saved output of earlier runs of the same command with other seeds: their rows go "
                    "into this run's table (a seed per run within an hour each, one README figure)")
    ap.add_argument("--against-no-selection", action="store_true",
                    help="after each seed, the recipe again without pass-rate selection, its RL given the "
                    "selection's time as extra steps (equal wall time), in the same store; the paired difference")
    ap.add_argument("--write-readme", action="store_true")
    return ap


def family_reward(family: str, reward: str | None) -> str:
    """The reward of the run: `--reward`, or the family's own; refused when it cannot read the family's answers."""
    fits = FAMILIES[family].rewards
    if reward is None:
        return fits[0]
    if reward not in fits:
        raise SystemExit(f"--reward {reward} does not read family {family}'s answers; it takes {' or '.join(fits)}")
    return reward


def measure_seed(s: int, recipe: str, over: dict, home: Path, fam: Family) -> dict:
    """One seed's run of the recipe in store `home` and its table row: the accuracies it printed, the folder's own
    greedy (evaluated after the run when the recipe trains SFT first), each change with its paired interval, and
    how often the greedy answers are right however worded."""
    from posttrain.recipes import resolve

    row, out = run_pipeline(s, recipe, over, home)
    print("\n".join(progress_lines(out)))
    if resolve(recipe, json.dumps(over)).sft.enabled:  # the folder's own evaluation, after the run
        t0 = time.perf_counter()
        from posttrain.config import PassRateConfig, to_dict

        # eval_pipeline selects no prompts: a selection setting there is refused as doing nothing
        alone = {**over, "data": {**over["data"], "pass_rate": to_dict(PassRateConfig())}}
        greedy_alone(s, recipe, alone, home)  # prints its greedy to 3 places: read it exactly
        folder = evaluations(home)["folder"]
        row["folder_greedy"] = sum(bool(p["correct"]) for p in folder) / len(folder)
        row["wall_s"] += time.perf_counter() - t0
        change = paired(home, "rl", "sft")
        row["over_sft_low"], row["over_sft_high"] = change["low"], change["high"]
    row["d_greedy"] = row["rl_greedy_accuracy"] - row.get("folder_greedy", row["sft_greedy_accuracy"])
    change = paired(home, "rl")
    row["greedy_low"], row["greedy_high"], row["greedy_p"] = change["low"], change["high"], change["p"]
    right = answers_right(home, fam)
    row["folder_right"], row["rl_right"] = right["folder"], right["rl"]
    return row


def main(argv: list[str] | None = None) -> int:
    from posttrain.recipes import resolve

    args = parser().parse_args(argv)
    argv = argv if argv is not None else sys.argv[1:]
    if args.on == "validation" and (args.write_readme or args.rows_from):
        raise SystemExit("--on validation: figures for choosing a recipe; --write-readme and --rows-from take test "
                         "figures only")
    earlier = tuple(read_earlier(log, argv) for log in args.rows_from)
    seen = [r["seed"] for run in earlier for r in run.rows] + args.seeds
    if len(set(seen)) != len(seen):
        raise SystemExit(f"--rows-from: a seed measured twice ({seen})")
    fam, reward = FAMILIES[args.family], family_reward(args.family, args.reward)
    spec = task_spec("--task", args.task) if args.task is not None else dict(fam.task)
    train_spec = None if args.train_task is None else task_spec("--train-task", args.train_task)
    check_split(args.split, train_spec is not None)
    sizes = Sizes(args.train, args.validation_n, args.eval)
    if not (MODEL / "model.safetensors").is_file():
        raise SystemExit(f"{MODEL}: no model folder; run `make real-model` first")
    if args.against_no_selection and not resolve(args.recipe, args.overrides).data.pass_rate.enabled:
        raise SystemExit(f"--against-no-selection: recipe {args.recipe} selects no prompts (data.pass_rate)")
    deps = install_reasoning_gym()
    rows, versus, failed = [], [], []
    with tempfile.TemporaryDirectory(prefix="posttrain-real-") as tmp:
        task = build_task(Path(tmp) / "task", deps, sizes, reward, args.split, spec, train_spec, evaluate=args.on)
        for s in args.seeds:
            home = Path(tmp) / f"home{s}"
            over = overrides(task, json.loads(args.overrides))
            row = measure_seed(s, args.recipe, over, home, fam)
            if args.keep is not None:
                keep_run(home, args.keep / f"seed{s}")
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.against_no_selection:  # a failure here keeps the seed's row and table, and exits 1
                try:
                    versus.append(against_no_selection(s, args.recipe, over, home))
                except (SystemExit, Exception) as e:  # noqa: BLE001 (reported; the exit code says so)
                    failed.append(f"seed {s} against no selection: {type(e).__name__}: {e}")
                    continue
                print(json.dumps({"against_no_selection": versus[-1]}), flush=True)
    load = os.getloadavg()
    block = table(rows, argv, load, sizes, spec, train_spec, earlier, args.family, args.on)
    print(block)
    if versus:
        print("\nPass-rate selection against none at equal wall time (selection + RL's steps; the same test problems):")
        print(selection_table(versus))
    if args.write_readme:
        print(f"wrote the table into {write_block(block, *markers(args.family))}")
    if failed:
        print("\n".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
