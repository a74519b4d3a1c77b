"""bench/real_model_sweep.py --table: its OUT/evaluations.jsonl as a markdown table, each config paired problem by
problem with its own step 0 and with a baseline config at the same step."""

from __future__ import annotations

import json
from pathlib import Path


def table(out: Path, baseline: str) -> str:
    """OUT/evaluations.jsonl as a markdown table: each config's validation greedy at each evaluated step, its
    change from its own step 0 (the start model), and from config `baseline` at the same step - paired over
    the same validation problems, 95% interval (posttrain.eval.intervals.paired_change). The last line of a
    (config, step) counts, so a config run again replaces its earlier figures."""
    from posttrain.eval.intervals import paired_change

    rows, selection = {}, {}
    for line in (out / "evaluations.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "pass_rate" in r:
            selection[r["name"]] = r["pass_rate"]
        elif "right" in r:
            rows[(r["name"], r["step"])] = r
    if (baseline, 0) not in rows:
        raise SystemExit(f"--table: no config {baseline!r} with a step-0 evaluation in {out / 'evaluations.jsonl'} "
                         f"(configs: {sorted({n for n, _ in rows})}); name one with --baseline")

    def change(after: str, before: str) -> str:
        if len(after) != len(before):
            return "n/a (other problems)"
        c = paired_change([b == "1" for b in after], [b == "1" for b in before])
        return f"{c.change:+.3f} ({c.low:+.3f}, {c.high:+.3f})"

    head = (f"| config | step | validation greedy | from its step 0 (95% paired) | from {baseline} at this step "
            "(95% paired) | train acc | wall s |")
    lines = [head, "|---|---|---|---|---|---|---|"]
    for (name, step), r in sorted(rows.items(), key=lambda kv: (kv[0][0] != baseline, kv[0][0], kv[0][1])):
        start, base = rows.get((name, 0)), rows.get((baseline, step))
        lines.append(f"| {name} | {step} | {r['validation_greedy']:.3f} | "
                     f"{change(r['right'], start['right']) if start and step else ''} | "
                     f"{change(r['right'], base['right']) if base and name != baseline else ''} | "
                     f"{'' if r['train_acc'] is None else format(r['train_acc'], '.3f')} | {r['s']:.0f} |")
    lines += ["", *(f"- selection for {name}: {json.dumps(info)}" for name, info in selection.items())]
    return "\n".join(lines)
