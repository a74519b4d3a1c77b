"""Rollout ahead of the update on the embedded default over seeds: the synchronous run and the async one (rl.max_staleness)
from the same SFT model, in one run - docs/rl.md's `async_seeds` table comes from this script.

    .venv/bin/python bench/async_seeds.py                         # seeds 0 1 2, staleness 1
    .venv/bin/python bench/async_seeds.py --overrides '{"placement": {"policy_workers": 1}}' --write-docs

For each seed s, in one fresh store, `make run`'s job (`pyflyte run workflows/pipeline.py pipeline`, every seed = s:
bench/default_seeds.py's run_pipeline) twice, one after the other: synchronous, then with `rl.max_staleness` k
(and `--overrides`, applied to the async run only); data, SFT and the SFT model's evaluation are cache hits the
second time, so the two RL runs start from the same model. Per RL run, from its model's manifest: generated tokens
(sampled, up to EOS) over the steps' wall time (the sum of step times: what the loop took end to end, the async
run's waits for generation included), and the held-out greedy accuracy the pipeline printed. The ratio async /
sync is within the seed's pair.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from default_seeds import _commit, run_pipeline, write_block


def rl_run(home: Path, staleness: int) -> dict:
    """Tokens, wall and tokens/s of the final RL model with `rl.max_staleness` = staleness in store `home`."""
    from posttrain.artifacts import ArtifactStore

    store = ArtifactStore(home)
    runs = [m for m in store.list(kind="model") if "history" in m.extra
            and (m.config.get("rl") or {}).get("max_staleness", 0) == staleness]
    if not runs:
        raise SystemExit(f"{home}: no RL model with rl.max_staleness {staleness}")
    h = max(runs, key=lambda m: m.extra["step"]).extra["history"]  # the last checkpoint: the final model
    tokens, wall = sum(x["generated_tokens"] for x in h), sum(x["step_s"] for x in h)
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
            "staleness_max": max(x.get("async/staleness_max", 0.0) for x in h)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--overrides", default="{}", help="JSON merged into the async run's overrides only")
    ap.add_argument("--write-docs", action="store_true", help="replace docs/rl.md's async_seeds table with this run's")
    args = ap.parse_args(argv)
    extra = json.loads(args.overrides)
    extra.setdefault("rl", {})["max_staleness"] = args.staleness
    rows = []
    for s in args.seeds:
        with tempfile.TemporaryDirectory(prefix=f"posttrain-async-seed{s}-") as tmp:
            sync, _ = run_pipeline(s, "tiny_cpu", {}, Path(tmp), what="synchronous")
            ahead, _ = run_pipeline(s, "tiny_cpu", extra, Path(tmp), what=f"rl.max_staleness {args.staleness}")
            row = {"seed": s, "sft": sync["sft_greedy_accuracy"], "sync_greedy": sync["rl_greedy_accuracy"],
                   "async_greedy": ahead["rl_greedy_accuracy"], "sync": rl_run(Path(tmp), 0),
                   "async": rl_run(Path(tmp), args.staleness)}
        row["ratio"] = row["async"]["tok_s"] / row["sync"]["tok_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    load = os.getloadavg()
    lines = [(f"| seed | SFT greedy | sync RL greedy | staleness {args.staleness} RL greedy | sync tok/s | "
             f"staleness {args.staleness} tok/s | ratio |"), "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['seed']} | {r['sft']:.3f} | {r['sync_greedy']:.3f} | {r['async_greedy']:.3f} | "
              f"{r['sync']['tok_s']:.0f} | {r['async']['tok_s']:.0f} | x{r['ratio']:.2f} |" for r in rows]
    ratios = [r["ratio"] for r in rows]
    lines += ["", (f"Async / sync generated tokens per second of the RL loop: median x{statistics.median(ratios):.2f} "
              f"(min x{min(ratios):.2f}, max x{max(ratios):.2f}); async held-out greedy min "
              f"{min(r['async_greedy'] for r in rows):.3f}. Tokens per second = sampled tokens / the sum of the "
              f"steps' wall time. Command: `.venv/bin/python bench/async_seeds.py "
              f"{' '.join(argv if argv is not None else sys.argv[1:])}` ({_commit()}; load average "
              f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end).")]
    block = "\n".join(lines)
    print(block)
    if args.write_docs:
        page = write_block(block, "<!-- async_seeds:begin -->", "<!-- async_seeds:end -->")
        print(f"wrote the table into {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
