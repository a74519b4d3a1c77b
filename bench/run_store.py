"""What a real-model run leaves behind, read back: its store's evaluations (every problem's greedy completion),
the paired changes between them, the RL steps, and the progress worth keeping from its printed output
(bench/real_model.py and bench/selection_vs_none.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from rg_task import Family


def evaluations(home: Path) -> dict[str, list[dict]]:
    """{"folder" | "sft" | "rl": every test problem's result (prompt, answer, greedy completion, correct)} from the
    run's eval artifacts' report.json: the folder's (eval-base-*), the SFT model's (eval-sft-*, when the recipe runs
    SFT) and the RL model's."""
    out = {}
    for path in sorted((home / "objects").glob("*/manifest.json")):
        m = json.loads(path.read_text())
        if m["kind"] == "eval":
            role = "folder" if m["name"].startswith("eval-base") else "sft" if m["name"].startswith("eval-sft") else "rl"
            out[role] = json.loads((path.parent / "files" / "report.json").read_text())["problems"]
    if not {"folder", "rl"} <= set(out):
        raise SystemExit(f"{home}: expected the folder's and the RL model's evaluations, found {sorted(out)}")
    return out


def answers_right(home: Path, family: Family) -> dict[str, float]:
    """{"folder" | "sft" | "rl": share of test problems whose greedy completion's answer, read as the family's reward
    reads it (arithmetic: the last number), is the answer}, from the eval artifacts (`evaluations`)."""
    return {role: sum(family.same(family.extract(p["greedy"]), p["answer"]) for p in problems) / len(problems)
            for role, problems in evaluations(home).items()}


def paired(home: Path, after: str, before: str = "folder") -> dict[str, float]:
    """The greedy change from model `before` to `after` problem by problem on the same test problems: {"low",
    "high"} (95%, Newcombe's interval for paired proportions) and {"p"} (McNemar's exact test), as
    posttrain.eval.compare gives every comparison."""
    from posttrain.eval.intervals import paired_change

    evals = evaluations(home)
    a, b = evals[after], evals[before]
    if [(p["prompt"], p["answer"]) for p in a] != [(p["prompt"], p["answer"]) for p in b]:
        raise SystemExit(f"{home}: the {after} and {before} evaluations did not score the same problems in order")
    change = paired_change([bool(p["correct"]) for p in a], [bool(p["correct"]) for p in b])
    return {"low": change.low, "high": change.high, "p": change.p_value}


RAY_PREFIX = re.compile(r"^(\x1b\[[0-9;]*m)?\(\w+ pid=\d+\)(\x1b\[[0-9;]*m)? ")
"""What Ray puts before an actor's printed line (the controller's `rl step` lines): its colour codes and name."""


def progress_lines(out: str) -> list[str]:
    """The run's progress worth keeping from its stdout: the SFT budget, the selection, every RL step (printed by
    the controller actor: Ray's prefix taken off) and the evaluations."""
    lines = (RAY_PREFIX.sub("", line) for line in out.splitlines())
    return [line for line in lines if line.startswith(("sft: sft.tokens", "pass_rate:", "rl step", "eval "))]


def rl_history(manifests: list[Path]) -> list[dict]:
    """The RL steps of the run among `manifests`: the longest `extra.history` whose steps carry `step_s` (an RL
    checkpoint's; the SFT model's history, often longer, has none); [] when there is none."""
    steps: list[dict] = []
    for path in manifests:
        m = json.loads(path.read_text())
        history = (m.get("extra") or {}).get("history") or []
        if m["kind"] == "model" and history and all("step_s" in h for h in history) and len(history) > len(steps):
            steps = history
    return steps


def keep_run(home: Path, dest: Path) -> None:
    """The run's per-step RL metrics (steps.jsonl, from the last RL checkpoint's `extra.history`: the RL state folder
    is gone once the run has finished) and every evaluation's report (every problem's greedy completion), copied
    out of the temporary store before it is removed."""
    dest.mkdir(parents=True, exist_ok=True)
    manifests = sorted((home / "objects").glob("*/manifest.json"))
    for path in manifests:
        m = json.loads(path.read_text())
        if m["kind"] == "eval":
            shutil.copy(path.parent / "files" / "report.json", dest / f"{m['name']}.json")
    (dest / "steps.jsonl").write_text("".join(json.dumps(h) + "\n" for h in rl_history(manifests)))
