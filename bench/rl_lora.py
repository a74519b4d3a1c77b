"""RL with and without LoRA on a real 135M model: peak memory and step time, in turn on the same machine.

    .venv/bin/python bench/rl_lora.py                    # small_instruct_cpu on SmolLM2-135M-Instruct, 5 steps each
    .venv/bin/python bench/rl_lora.py --steps 3 --pairs 2 --lora '{"rank": 8}' --runs full,lora
    .venv/bin/python bench/rl_lora.py --runs full,lora_in_policy --in-policy-overrides '{"rl": {"policy_generate_batch": 32}}'
    .venv/bin/python bench/rl.py --sections lora         # the same, as a section of the RL benchmarks

Each run is `bench/rl_memory.py` in its own process (its own local Ray, PSS of every process of the run sampled
twice a second), in turn, --pairs times: `full` fine-tuning and `lora` (`model.lora`, default rank 16, alpha 32,
attention and MLP) with the recipe's rollout worker, then both with `placement.rollout_workers` 0 (`*_in_policy`:
the policy rank generates with its own model; no rollout worker, no weight transfer). It prints per run the
peak summed PSS and the policy's peak, the median step time over steps 2..N (the first is warm-up) and the
update's and rollout's median worker seconds; then each run / full ratios. The reward is
the recipe's verifier; with a few steps at the recipe's lr it stays near 0, which changes no timing or memory.
Run it on an otherwise idle machine: Ray workers run at nice 15.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


RUNS = ("full", "lora", "full_in_policy", "lora_in_policy")


def one(steps: int, lora: dict | None, extra: dict, in_policy: bool = False) -> dict:
    over = {**extra, "model": {**extra.get("model", {}), **({"lora": lora} if lora is not None else {})}}
    if in_policy:
        over["placement"] = {**extra.get("placement", {}), "rollout_workers": 0}
    with tempfile.TemporaryDirectory(prefix="bench-rl-lora-") as tmp:
        out = Path(tmp) / "run.json"
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "rl_memory.py"), "--steps", str(steps),
                            "--overrides", json.dumps(over), "--json", str(out)], cwd=ROOT, capture_output=True,
                           text=True, check=False, env={**os.environ, "RAY_ADDRESS": "local"})
        if p.returncode != 0:
            raise SystemExit(f"bench/rl_memory.py ({json.dumps(over)}) failed:\n{p.stderr[-4000:]}")
        return json.loads(out.read_text())


def med(xs: list[float]) -> float:
    return statistics.median(xs[1:] if len(xs) > 1 else xs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--lora", default="{}", help="model.lora as JSON (default {}: rank 16, alpha 32, attention+MLP)")
    ap.add_argument("--overrides", default="{}", help="JSON overrides of small_instruct_cpu for every run")
    ap.add_argument("--in-policy-overrides", default="{}",
                    help='JSON overrides for the *_in_policy runs only (e.g. {"rl": {"policy_generate_batch": 32}})')
    ap.add_argument("--runs", default=",".join(RUNS), help=f"which runs, in this order (of {','.join(RUNS)}); "
                    "full must be one of them: the ratios are against it")
    args = ap.parse_args(argv)
    lora, extra, in_policy = json.loads(args.lora), json.loads(args.overrides), json.loads(args.in_policy_overrides)
    runs = args.runs.split(",")
    if "full" not in runs or not set(runs) <= set(RUNS):
        raise SystemExit(f"--runs {args.runs}: must name full and only runs of {RUNS}")
    rows = []
    for pair in range(args.pairs):
        for name in runs:
            over = extra
            if name.endswith("_in_policy"):
                over = {k: dict(v) if isinstance(v, dict) else v for k, v in extra.items()}
                for section, fields in in_policy.items():
                    over.setdefault(section, {}).update(fields)
            r = one(args.steps, lora if name.startswith("lora") else None, over, name.endswith("_in_policy"))
            rows.append({"pair": pair + 1, "run": name, **r})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nRL on {rows[0]['model']} ({rows[0]['recipe']}), {args.steps} steps per run, model.lora {args.lora}"
          + (f", overrides {args.overrides}" if extra else "")
          + (f", *_in_policy runs also {args.in_policy_overrides}" if in_policy else ""))
    print("| pair | run | peak summed PSS (GiB) | policy peak (GiB) | rollout peak (GiB) | step s (median 2..N) | "
          "update s | rollout s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['pair']} | {r['run']} | {r['peak_total_gib']:.2f} | {r['peak_role_gib'].get('policy', 0):.2f} | "
              f"{r['peak_role_gib'].get('rollout', 0):.2f} | {med(r['step_s']):.1f} | {med(r['update_s']):.1f} | "
              f"{med(r['rollout_s']):.1f} |")
    for pair in range(1, args.pairs + 1):
        f = next(r for r in rows if r["pair"] == pair and r["run"] == "full")
        for lo in (r for r in rows if r["pair"] == pair and r["run"] != "full"):
            print(f"pair {pair}: {lo['run']} / full - peak memory x{lo['peak_total_gib'] / f['peak_total_gib']:.2f}, "
                  f"step time x{med(lo['step_s']) / med(f['step_s']):.2f}, "
                  f"update x{med(lo['update_s']) / med(f['update_s']):.2f}")
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
