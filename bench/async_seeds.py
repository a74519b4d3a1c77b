"""Rollout ahead of the update on the embedded default over seeds: the synchronous run, in the recipe's placement and
in one where rollout and policy have a core each, and the async one (rl.max_staleness) in the latter, all from the
same SFT model, in one run - docs/async.md's `async_seeds` table comes from this script.

    .venv/bin/python bench/async_seeds.py --write-docs            # seeds 0 1 2, staleness 1, placement 1+1

For each seed s, in one fresh store, `make run`'s job (`pyflyte run workflows/pipeline.py pipeline`, every seed = s:
bench/default_seeds.py's run_pipeline) three times, one after the other: synchronous in the recipe's placement
(two policy ranks at one thread, a rollout worker at two: each phase has both cores), synchronous in `--placement`
(default "1+1": one policy rank and one rollout worker at one thread each - a core each, the shape of roles with
devices of their own), then with `rl.max_staleness` k in `--placement`. Data, SFT and the SFT model's evaluation
are cache hits after the first, so the three RL runs start from the same model. Per RL run, from its model's
manifest: generated tokens (sampled, up to EOS) over the steps' wall time (the sum of step times: what the loop
took end to end, the async run's waits for generation included), and the held-out greedy accuracy the pipeline
printed. Both ratios are within the seed's runs: async against the synchronous run in the same placement (what
overlap buys), and against the recipe's synchronous run (what it buys on this 2-core machine overall).
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


def rl_run(home: Path, staleness: int, placement: dict) -> dict:
    """Tokens, wall and tokens/s of the final RL model with `rl.max_staleness` = staleness and the placement
    settings `placement` (the recipe's where it names none) in store `home`."""
    from posttrain.artifacts import ArtifactStore

    def matches(m) -> bool:
        cfg = m.config  # an RL model (the SFT model keeps a history too, but no rl section and no step)
        return ("rl" in cfg and "step" in m.extra and cfg["rl"].get("max_staleness", 0) == staleness
                and all((cfg.get("placement") or {}).get(k) == v for k, v in placement.items())
                and (placement or (cfg.get("placement") or {}).get("policy_workers") != 1))

    runs = [m for m in ArtifactStore(home).list(kind="model") if "history" in m.extra and matches(m)]
    if not runs:
        raise SystemExit(f"{home}: no RL model with rl.max_staleness {staleness} and placement {placement}")
    h = max(runs, key=lambda m: m.extra["step"]).extra["history"]  # the last checkpoint: the final model
    tokens, wall = sum(x["generated_tokens"] for x in h), sum(x["step_s"] for x in h)
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
            "staleness_max": max(x.get("async/staleness_max", 0.0) for x in h)}


ONE_PLUS_ONE = {"policy_workers": 1, "torch_threads": 1, "rollout_threads": 1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--placement", default=json.dumps(ONE_PLUS_ONE),
                    help="JSON placement settings of the second synchronous run and the async one")
    ap.add_argument("--write-docs", action="store_true", help="replace docs/async.md's async_seeds table with this run's")
    args = ap.parse_args(argv)
    placement = json.loads(args.placement)
    k = args.staleness
    rows = []
    for s in args.seeds:
        with tempfile.TemporaryDirectory(prefix=f"posttrain-async-seed{s}-") as tmp:
            sync, _ = run_pipeline(s, "tiny_cpu", {}, Path(tmp), what="synchronous")
            sync_p, _ = run_pipeline(s, "tiny_cpu", {"placement": placement}, Path(tmp),
                                     what=f"synchronous in {placement}")
            ahead, _ = run_pipeline(s, "tiny_cpu", {"placement": placement, "rl": {"max_staleness": k}}, Path(tmp),
                                    what=f"rl.max_staleness {k} in {placement}")
            row = {"seed": s, "sft": sync["sft_greedy_accuracy"], "sync_greedy": sync["rl_greedy_accuracy"],
                   "sync_p_greedy": sync_p["rl_greedy_accuracy"], "async_greedy": ahead["rl_greedy_accuracy"],
                   "sync": rl_run(Path(tmp), 0, {}), "sync_p": rl_run(Path(tmp), 0, placement),
                   "async": rl_run(Path(tmp), k, placement)}
        row["ratio_p"] = row["async"]["tok_s"] / row["sync_p"]["tok_s"]
        row["ratio"] = row["async"]["tok_s"] / row["sync"]["tok_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    load = os.getloadavg()
    lines = [("| seed | SFT greedy | sync greedy (recipe) | sync tok/s (recipe) | sync greedy (P) | sync tok/s (P) | "
              f"staleness {k} greedy (P) | staleness {k} tok/s (P) | x sync (P) | x sync (recipe) |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['seed']} | {r['sft']:.3f} | {r['sync_greedy']:.3f} | {r['sync']['tok_s']:.0f} | "
              f"{r['sync_p_greedy']:.3f} | {r['sync_p']['tok_s']:.0f} | {r['async_greedy']:.3f} | "
              f"{r['async']['tok_s']:.0f} | x{r['ratio_p']:.2f} | x{r['ratio']:.2f} |" for r in rows]

    def spread(key: str) -> str:
        v = [r[key] for r in rows]
        return f"median x{statistics.median(v):.2f} (min x{min(v):.2f}, max x{max(v):.2f})"

    lines += ["", (f"P = placement {json.dumps(placement)}. Staleness {k} / synchronous generated tokens per second of "
              f"the RL loop: in the same placement {spread('ratio_p')}; against the recipe's synchronous run "
              f"{spread('ratio')}. Async held-out greedy min {min(r['async_greedy'] for r in rows):.3f}. Tokens per "
              f"second = sampled tokens / the sum of the steps' wall time. Command: `.venv/bin/python "
              f"bench/async_seeds.py {' '.join(argv if argv is not None else sys.argv[1:])}` ({_commit()}; load "
              f"average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end).")]
    block = "\n".join(lines)
    print(block)
    if args.write_docs:
        page = write_block(block, "<!-- async_seeds:begin -->", "<!-- async_seeds:end -->")
        print(f"wrote the table into {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
