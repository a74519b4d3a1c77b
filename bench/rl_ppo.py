"""The `ppo` section of bench/rl.py: the project's PPO against its GRPO on identical work, and against TRL's PPO
trainer where TRL ships one.

1. Start checkpoint: the tiny_cpu recipe's own SFT model, cached in the bench store (bench/rl_vs_trl.py).
2. GRPO with the tiny_cpu recipe's RL settings, then PPO with the tiny_cpu_ppo recipe's (the same batch - prompts
   x samples -, lr, warm-up, clip and steps; plus the critic), both through `run_rl` from that model, one after
   the other (never concurrently: on 2 cores timings of two runs at once are noise), `reps` times in turn
   (GRPO, PPO, GRPO, PPO, ...): this machine's speed drifts by 20-40 % over minutes, so one pair of runs says
   little and the ratio is taken within each pair.
3. Per run: median step time over the steps in which the policy trains (PPO's critic warm-up steps, which have no
   policy update, and the first step are left out of both), the median of each phase and of each role's compute;
   held-out greedy and sampled accuracy (the project's evaluation, recipe eval settings) of the first pair's
   models. The PPO / GRPO ratio per pair, its median over pairs, and the ratio the work predicts: GRPO's step
   plus the critic's phase (one policy-sized forward and backward), over GRPO's step.
4. TRL: the pinned TRL (bench/rl_vs_trl.py installs it) is asked whether it has a PPO trainer; when it does not,
   the section says so and runs nothing for it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def trl_has_ppo() -> tuple[bool, str]:
    """(whether the pinned TRL has a PPO trainer, what was found), asked in a subprocess on TRL's folder."""
    import rl_vs_trl

    folder = rl_vs_trl.install_trl()
    code = ("import json, trl, importlib.util; "
            "names = [n for n in ('PPOTrainer', 'PPOConfig') if hasattr(trl, n)]; "
            "exp = importlib.util.find_spec('trl.experimental.ppo') is not None; "
            "print(json.dumps({'version': trl.__version__, 'names': names, 'experimental': exp}))")
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(folder)},
                         capture_output=True, text=True, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    has = bool(found["names"]) or found["experimental"]
    return has, (f"trl {found['version']}: " + (f"{found['names']}" if found["names"] else "no trl.PPOTrainer") +
                 (", trl.experimental.ppo present" if found["experimental"] else ", no trl.experimental.ppo"))


def compare(steps: int | None, reps: int = 3) -> dict:
    import rl_vs_trl

    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.recipes import tiny_cpu, tiny_cpu_ppo

    grpo, ppo = tiny_cpu(), tiny_cpu_ppo()
    store = ArtifactStore(rl_vs_trl.cache_dir() / "store")
    model_ref, ds_ref = rl_vs_trl.start_checkpoint(grpo, store)
    skip = max(1, ppo.rl.critic_warmup_steps + 1)  # steps 1..skip are left out of both medians

    def acc(ref):
        e = stages.evaluate(grpo.eval, grpo.reward, model=ref, dataset=ds_ref, run_id="bench-rl-ppo", store=store)
        return e.greedy_accuracy, e.sampled_accuracy

    pairs = []
    for rep in range(reps):
        rows = {}
        for name, recipe in (("GRPO", grpo), ("PPO", ppo)):
            rl_cfg = replace(recipe.rl, checkpoint_every=0, **({"steps": steps} if steps else {}))
            print(f"\n== pair {rep + 1}/{reps}, {name}: {rl_cfg.steps} steps ==", flush=True)
            r = rl_vs_trl.run_project(recipe, rl_cfg, store, model_ref, ds_ref)
            hist = r.pop("history")[skip:]
            r["median_step_s"] = statistics.median(h.step_s for h in hist)
            r["phase_s"] = _medians([h.phase_s for h in hist])
            r["compute_s"] = _medians([h.compute_s for h in hist])
            if rep == 0:
                r["after"] = acc(r["model"])
            rows[name] = r
        pairs.append(rows)
    return {"start": acc(model_ref), "pairs": pairs, "skip": skip,
            "rl": replace(ppo.rl, **({"steps": steps} if steps else {}))}


def _medians(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted(set().union(*dicts)) if dicts else []
    return {k: statistics.median(d.get(k, 0.0) for d in dicts) for k in keys}


def step_ratios(res: dict) -> list[tuple[float, float, float, float]]:
    """Per pair: (GRPO median step s, PPO median step s, PPO / GRPO, the ratio the critic's extra work predicts:
    (GRPO step + PPO's critic phase) / GRPO step)."""
    out = []
    for rows in res["pairs"]:
        g, p = rows["GRPO"]["median_step_s"], rows["PPO"]["median_step_s"]
        out.append((g, p, p / g, (g + rows["PPO"]["phase_s"].get("critic", 0.0)) / g))
    return out


def pairs_table(res: dict) -> tuple[list[str], str]:
    """The docs' table of the step-time pairs and its summary line."""
    pairs = step_ratios(res)
    lines = ["| pair | GRPO step s | PPO step s | PPO / GRPO | (GRPO step + critic phase) / GRPO step |",
             "|---|---|---|---|---|", *(f"| {k + 1} | {g:.3f} | {p:.3f} | x{r:.2f} | x{pred:.2f} |"
                                        for k, (g, p, r, pred) in enumerate(pairs))]
    ratios = [r for _, _, r, _ in pairs]
    (g0, s0), first, rl = res["start"], res["pairs"][0], res["rl"]
    phases = first["PPO"]["phase_s"]
    summary = (f"Median x{statistics.median(ratios):.2f} (min x{min(ratios):.2f}, max x{max(ratios):.2f}); step medians "
               f"over steps {res['skip'] + 1}-{rl.steps}. Per phase (PPO, pair 1): " +
               ", ".join(f"{k} {phases[k]:.2f} s" for k in ("rollout", "critic", "update") if k in phases) +
               f". Held-out greedy / sampled after pair 1 (start {g0:.3f} / {s0:.3f}): GRPO "
               f"{first['GRPO']['after'][0]:.3f} / {first['GRPO']['after'][1]:.3f}, PPO {first['PPO']['after'][0]:.3f} / "
               f"{first['PPO']['after'][1]:.3f}")
    return lines, summary


def print_section(res: dict) -> None:
    (g0, s0), pairs, rl = res["start"], res["pairs"], res["rl"]
    print(f"\n## ppo: tiny_cpu SFT model -> GRPO (tiny_cpu) and PPO (tiny_cpu_ppo), {rl.steps} steps x "
          f"{rl.prompts_per_step} prompts x {rl.samples_per_prompt} samples; PPO critic lr {rl.critic_lr:g}, warm-up "
          f"{rl.critic_warmup_steps} steps, gamma {rl.gamma}, lam {rl.lam}, value clip {rl.value_clip}; "
          f"{len(pairs)} pairs of runs in turn, step medians over steps {res['skip'] + 1}-{rl.steps}")
    print("| algorithm | greedy start -> after (gain) | sampled start -> after (gain) |")
    print("|---|---|---|")
    for name, r in pairs[0].items():
        g1, s1 = r["after"]
        print(f"| {name} | {g0:.3f} -> {g1:.3f} ({g1 - g0:+.3f}) | {s0:.3f} -> {s1:.3f} ({s1 - s0:+.3f}) |")
    print("\n| pair | GRPO step s | PPO step s | PPO / GRPO | predicted: (GRPO step + critic phase) / GRPO step |")
    print("|---|---|---|---|---|")
    ratios = []
    for k, (g, p, r, pred) in enumerate(step_ratios(res)):
        ratios.append(r)
        print(f"| {k + 1} | {g:.3f} | {p:.3f} | x{r:.2f} | x{pred:.2f} |")
    for name in ("GRPO", "PPO"):
        r = pairs[0][name]
        print(f"{name} (pair 1) phase medians: " + ", ".join(f"{k} {v:.3f}" for k, v in r["phase_s"].items()) +
              "; compute medians: " + ", ".join(f"{k} {v:.3f}" for k, v in r["compute_s"].items()))
    ratio = statistics.median(ratios)
    after = pairs[0]["PPO"]["after"][0]
    print(f"PPO / GRPO median step time x{ratio:.2f} over {len(ratios)} pairs (min x{min(ratios):.2f}, max "
          f"x{max(ratios):.2f}; target <= 1.6: {'met' if ratio <= 1.6 else 'not met'}); PPO greedy after "
          f"{after:.3f} (target >= 0.90: {'met' if after >= 0.9 else 'not met'})")
    has, found = trl_has_ppo()
    print(f"TRL PPO: {found} - " + ("present, but no comparison is wired yet" if has else
                                     "the pinned TRL ships no PPO trainer, so there is no peer run on identical work"))
