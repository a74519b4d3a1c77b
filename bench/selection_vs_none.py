"""Pass-rate selection against none at equal wall time (bench/real_model.py --against-no-selection): the recipe
again in the selected run's store, without the selection, its RL given the selection's seconds as extra steps."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from default_seeds import run_pipeline
from run_store import evaluations, rl_history


def against_no_selection(seed: int, recipe: str, over: dict, home: Path) -> dict:
    """The recipe again in the selected run's store (SFT and its evaluation cached), without pass-rate selection,
    its RL given the selection's seconds as extra steps at the selected run's mean step time (equal wall time for
    selection + RL); the paired difference on the same problems, the selected run's RL model minus this one's."""
    from posttrain.config import PassRateConfig, to_dict
    from posttrain.eval.intervals import paired_change
    from posttrain.recipes import resolve

    first = sorted((home / "objects").glob("*/manifest.json"))
    manifests = [json.loads(p.read_text()) for p in first]
    selection = [m["metrics"]["seconds"] for m in manifests if (m.get("extra") or {}).get("stage") == "pass_rate"]
    step_s = [h["step_s"] for h in rl_history(first)]
    if len(selection) != 1 or not step_s:
        raise SystemExit(f"{home}: expected one pass-rate selection (with its seconds) and RL steps")
    steps = resolve(recipe, json.dumps(over)).rl.steps
    extra = round(selection[0] / statistics.mean(step_s))
    plain = {**over, "data": {**over["data"], "pass_rate": to_dict(PassRateConfig())},
             "rl": {**over.get("rl", {}), "steps": steps + extra}}
    with_selection = evaluations(home)["rl"]
    row, _ = run_pipeline(seed, recipe, plain, home, what="without pass-rate selection")
    new = [p for p in sorted((home / "objects").glob("*/manifest.json")) if p not in first]
    evals = [json.loads((p.parent / "files" / "report.json").read_text())["problems"] for p in new
             if json.loads(p.read_text())["kind"] == "eval"]
    plain_s = [h["step_s"] for h in rl_history(new)]
    if len(evals) != 1 or len(plain_s) != steps + extra:
        raise SystemExit(f"{home}: expected the run without selection to add one evaluation and {steps + extra} RL "
                         f"steps; found {len(evals)} and {len(plain_s)}")
    without = evals[0]
    if [(p["prompt"], p["answer"]) for p in without] != [(p["prompt"], p["answer"]) for p in with_selection]:
        raise SystemExit(f"{home}: the two RL models were not scored on the same problems in order")
    a, b = [bool(p["correct"]) for p in with_selection], [bool(p["correct"]) for p in without]
    change = paired_change(a, b)
    return {"seed": seed, "selection_s": selection[0], "steps": steps, "rl_s": sum(step_s),
            "plain_steps": steps + extra, "plain_rl_s": sum(plain_s), "selected_greedy": sum(a) / len(a),
            "plain_greedy": sum(b) / len(b), "d": (sum(a) - sum(b)) / len(a), "low": change.low,
            "high": change.high, "p": change.p_value, "plain_wall_s": row["wall_s"]}


def selection_table(rows: list[dict]) -> str:
    """Pass-rate selection against none at equal wall time, one row per seed."""
    lines = [("| seed | selection | RL with selection | RL without (more steps) | with selection greedy "
              "| without greedy | selection's gain (95% paired interval) |"), "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['selection_s'] / 60:.1f} min | {r['steps']} steps, {r['rl_s'] / 60:.1f} min "
                     f"| {r['plain_steps']} steps, {r['plain_rl_s'] / 60:.1f} min | {r['selected_greedy']:.3f} | "
                     f"{r['plain_greedy']:.3f} | {r['d']:+.3f} ({r['low']:+.3f}, {r['high']:+.3f}) |")
    return "\n".join(lines)
