"""Sweep DPO and reward-model settings over seeds on the embedded default: how the tiny_cpu recipe's dense
sections were chosen (docs/dense.md, "Over seeds").

    .venv/bin/python bench/dense_sweep.py --seeds 2 \
        --dpo '[{}, {"steps": 150}, {"lr": 4e-5}, {"beta": 0.3}, {"sft_weight": 0.0}]' \
        --rm '[{}, {"steps": 100}, {"lr": 2e-4, "steps": 100}]'

For each seed, one store (--root/seedS, kept, so a second sweep reuses it) holds the `dpo_pipeline`'s data, SFT
model and pairs: the first variant pays for them (~4 min), every later one runs only its DPO or reward model and
the evaluation (~40-60 s). Each variant is a JSON object merged over the recipe's `dpo` (resp. `reward_model`)
section, with every seed set to S as in bench/dense_seeds.py. Prints one JSON line per run: the variant, held-out
greedy and sampled accuracy (DPO) or held-out pairwise accuracy (reward model), and the wall time.

Measured 2026-11-25 (the sweep behind the recipe; at the time the recipe had sft_weight 0 and 100 RM steps):
seed 2, plain DPO 0.844 greedy; 150 steps 0.774; lr 4e-5 0.772; lr 1e-5 0.490; 40 steps 0.506; beta 0.3 / 0.5
0.858 / 0.856; sft_weight 1 0.976 (seeds 0 / 1: 0.982 / 0.986). Reward model, seed 2: 100 steps 0.900, 200
steps 0.973, 200 steps at lr 5e-5 0.934, 100 steps at lr 2e-4 0.961 (seeds 0 / 1 at 200 steps: 0.992 / 0.980).
Run it alone on the machine (wall times are noise otherwise; the accuracies are deterministic on one CPU).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ siblings
from dense_seeds import accuracies, pyflyte, seed_overrides


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--dpo", default="[{}]", help="JSON list of dpo-section overrides, one run each")
    ap.add_argument("--rm", default="[]", help="JSON list of reward_model-section overrides, one run each")
    ap.add_argument("--root", default="/tmp/posttrain-dense-sweep", help="one store per seed under this folder")
    args = ap.parse_args(argv)
    dpo_variants, rm_variants = json.loads(args.dpo), json.loads(args.rm)
    for seed in args.seeds:
        home = Path(args.root) / f"seed{seed}"
        home.mkdir(parents=True, exist_ok=True)
        for v in dpo_variants:
            out, wall = pyflyte("dpo_pipeline", seed_overrides(seed, {"dpo": v}), home)
            acc = accuracies(out)
            print(json.dumps({"seed": seed, "dpo": v, "greedy": acc.get("rl_greedy_accuracy"),
                              "sampled": acc.get("rl_sampled_accuracy"), "wall_s": round(wall)}), flush=True)
        for v in rm_variants:
            out, wall = pyflyte("reward_model_pipeline", seed_overrides(seed, {"reward_model": v}), home)
            pairwise = float(re.search(r"pairwise accuracy ([0-9.]+) on", out).group(1))
            print(json.dumps({"seed": seed, "reward_model": v, "pairwise": pairwise, "wall_s": round(wall)}),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
