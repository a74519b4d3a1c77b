"""The `ppo` section of bench/rl.py: the project's PPO against its GRPO on identical work, and against TRL's PPO
trainer where TRL ships one.

1. Start checkpoint: the tiny_cpu recipe's own SFT model, cached in the bench store (bench/rl_vs_trl.py).
2. GRPO with the tiny_cpu recipe's RL settings, then PPO with the tiny_cpu_ppo recipe's (the same batch - prompts
   x samples -, lr, warm-up, clip and steps; plus the critic), both through `run_rl` from that model, one after
   the other (never concurrently: on 2 cores timings of two runs at once are noise).
3. Per run: median step time (the first step left out: warm-up), the median of each phase, and held-out greedy and
   sampled accuracy (the project's evaluation, recipe eval settings) of the final model; PPO / GRPO ratios.
4. TRL: the pinned TRL (bench/rl_vs_trl.py installs it) is asked whether it has a PPO trainer; when it does not,
   the section says so and runs nothing for it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
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
    out = subprocess.run([str(ROOT / ".venv/bin/python"), "-c", code], env={"PYTHONPATH": str(folder)},
                         capture_output=True, text=True, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    has = bool(found["names"]) or found["experimental"]
    return has, (f"trl {found['version']}: " + (f"{found['names']}" if found["names"] else "no trl.PPOTrainer") +
                 (", trl.experimental.ppo present" if found["experimental"] else ", no trl.experimental.ppo"))


def compare(steps: int | None) -> dict:
    import rl_vs_trl

    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.recipes import tiny_cpu, tiny_cpu_ppo

    grpo, ppo = tiny_cpu(), tiny_cpu_ppo()
    store = ArtifactStore(rl_vs_trl.cache_dir() / "store")
    model_ref, ds_ref = rl_vs_trl.start_checkpoint(grpo, store)

    def acc(ref):
        e = stages.evaluate(grpo.eval, grpo.reward, model=ref, dataset=ds_ref, run_id="bench-rl-ppo", store=store)
        return e.greedy_accuracy, e.sampled_accuracy

    rows = {}
    for name, recipe in (("GRPO", grpo), ("PPO", ppo)):
        rl_cfg = replace(recipe.rl, checkpoint_every=0, **({"steps": steps} if steps else {}))
        print(f"\n== {name}: {rl_cfg.steps} steps ==", flush=True)
        r = rl_vs_trl.run_project(recipe, rl_cfg, store, model_ref, ds_ref)
        r["after"] = acc(r["model"])
        r["median_step_s"] = statistics.median(r["step_s"][1:] or r["step_s"])
        rows[name] = r
    return {"start": acc(model_ref), "rows": rows, "rl": replace(ppo.rl, **({"steps": steps} if steps else {}))}


def print_section(res: dict) -> None:
    (g0, s0), rows, rl = res["start"], res["rows"], res["rl"]
    print(f"\n## ppo: tiny_cpu SFT model -> GRPO (tiny_cpu) and PPO (tiny_cpu_ppo), {rl.steps} steps x "
          f"{rl.prompts_per_step} prompts x {rl.samples_per_prompt} samples; PPO critic lr {rl.critic_lr:g}, warm-up "
          f"{rl.critic_warmup_steps} steps, gamma {rl.gamma}, lam {rl.lam}, value clip {rl.value_clip}")
    print("| algorithm | greedy start -> after (gain) | sampled start -> after (gain) | median step s | RL loop s |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        g1, s1 = r["after"]
        print(f"| {name} | {g0:.3f} -> {g1:.3f} ({g1 - g0:+.3f}) | {s0:.3f} -> {s1:.3f} ({s1 - s0:+.3f}) | "
              f"{r['median_step_s']:.3f} | {r['wall_s']:.1f} |")
    p, g = rows["PPO"], rows["GRPO"]
    ratio = p["median_step_s"] / g["median_step_s"]
    print(f"PPO / GRPO median step time x{ratio:.2f} (target <= 1.6: {'met' if ratio <= 1.6 else 'not met'}); "
          f"PPO greedy after {p['after'][0]:.3f} (target >= 0.90: {'met' if p['after'][0] >= 0.9 else 'not met'})")
    has, found = trl_has_ppo()
    print(f"TRL PPO: {found} - " + ("present, but no comparison is wired yet" if has else
                                     "the pinned TRL ships no PPO trainer, so there is no peer run on identical work"))
