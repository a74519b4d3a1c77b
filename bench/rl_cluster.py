"""The `cluster` section of bench/rl.py: RL step time on the cluster rehearsal against local Ray.

1. Start checkpoint: the tiny_cpu recipe's own SFT model, cached in the bench store (bench/rl_vs_trl.py).
2. The tiny_cpu recipe's RL (its batch, lr, placement - COLOCATED, 2 policy ranks) from that model, `steps` steps,
   alternately (never concurrently) on
   - local Ray: one node with a logical CPU per core, as `pyflyte run` gives it (run_rl's own ray.init);
   - the rehearsal: one local Ray node per pod of the RL task's RayJob (rehearsal/rayjob_shape.py::local_cluster: a
     1-CPU head, the `rollout` pod, two `train` pods) - the per-pod placement plan, weights through Ray's
     object store from a train pod to the rollout pod;
   `reps` pairs, each run in its own subprocess (a Ray cluster on the machine captures every bare ray.init()).
3. Per run: the median step time over steps 2..N (the first step pays for actor warm-up); the ratio within each
   pair and its median. All pods share this machine's 2 cores, so the rehearsal measures the orchestration's cost
   (placement, object-store weight transfer, more Ray processes), not a real cluster's speed.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(where: str, steps: int) -> dict:
    """One run (in its own process): `where` is "local" or "cluster"."""
    import contextlib

    import rl_vs_trl

    from posttrain.artifacts import ArtifactStore
    from posttrain.recipes import tiny_cpu

    recipe = tiny_cpu()
    store = ArtifactStore(rl_vs_trl.cache_dir() / "store")
    model_ref, ds_ref = rl_vs_trl.start_checkpoint(recipe, store)
    if where == "cluster":
        from rehearsal.rayjob_shape import local_cluster
        from tasks.rl import ray_config

        ctx = local_cluster(ray_config)
    else:
        ctx = contextlib.nullcontext()
    with ctx:
        r = rl_vs_trl.run_project(recipe, replace(recipe.rl, steps=steps, checkpoint_every=0), store, model_ref,
                                  ds_ref)
    steps_s = r["step_s"][1:]
    return {"where": where, "median_step_s": statistics.median(steps_s), "steps": len(r["step_s"]),
            "total_s": r["total_s"]}


def compare(steps: int | None, reps: int = 2) -> list[dict]:
    steps = steps or 20
    pairs = []
    for rep in range(reps):
        row = {}
        for where in ("local", "cluster"):
            print(f"\n== pair {rep + 1}/{reps}: {where} Ray, {steps} steps ==", flush=True)
            out = subprocess.run([sys.executable, __file__, "--child", where, "--steps", str(steps)], cwd=ROOT,
                                 capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise SystemExit(f"cluster section, {where} run failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
            row[where] = json.loads(out.stdout.split("RESULT")[-1])
        pairs.append(row)
    return pairs


def print_section(pairs: list[dict]) -> None:
    steps = pairs[0]["local"]["steps"]
    print(f"\n## cluster: tiny_cpu RL, {steps} steps, local Ray (1 node) vs the RayJob rehearsal (head + rollout + "
          f"2 train pods as local Ray nodes); medians over steps 2-{steps}; {len(pairs)} pairs in turn")
    print("| pair | local Ray step s | rehearsal step s | rehearsal / local |")
    print("|---|---|---|---|")
    ratios = []
    for k, p in enumerate(pairs):
        ratios.append(p["cluster"]["median_step_s"] / p["local"]["median_step_s"])
        print(f"| {k + 1} | {p['local']['median_step_s']:.3f} | {p['cluster']['median_step_s']:.3f} | "
              f"x{ratios[-1]:.2f} |")
    r = statistics.median(ratios)
    print(f"rehearsal / local median x{r:.2f} (min x{min(ratios):.2f}, max x{max(ratios):.2f}; target <= 1.5: "
          f"{'met' if r <= 1.5 else 'not met'})")


if __name__ == "__main__":
    import argparse

    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", choices=["local", "cluster"], required=True)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    print("RESULT" + json.dumps(child(a.child, a.steps)), flush=True)
