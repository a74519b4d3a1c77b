"""The `async` section of bench/rl.py: the synchronous loop against rollout ahead of the update (rl.max_staleness
1 and 2) on identical work, in one run.

1. Start checkpoint: the tiny_cpu recipe's own SFT model, cached in the bench store (bench/rl_vs_trl.py).
2. Per setting, through `run_rl` from that model, one run after the other (never concurrently), `reps` rounds in
   turn (sync, staleness 1, ..., sync, ...): this machine's speed drifts by 20-40 % over minutes, so ratios are
   taken within each round. Settings: the recipe's placement (2 policy ranks at 1 thread, a rollout worker at 2:
   four threads on 2 cores once they overlap) at staleness 0, 1 and 2; "1+1" (one policy rank and one rollout
   worker, one thread each: a core each) and "2+1" (two policy ranks and a rollout worker, one thread each) at
   staleness 0 and 1.
3. Per run: generated tokens / the steps' wall time (end to end: the sum of step times, which in an async run
   include the waits for generation), median step time, the policy's and the rollout's idle share of a step
   (idle/update, idle/rollout: 1 - the worker-timed seconds of one step's update / generation over the step's
   wall), and in the first round held-out greedy accuracy (the project's evaluation, recipe eval settings) and the
   first step whose training accuracy reached 0.95 with the seconds until then.
4. A projection to a GPU cluster from the first round's synchronous phase times (bench/rl_async_projection.py,
   its assumptions stated there and printed).
5. The same on a real model (`compare_real`): the small_instruct_cpu recipe on SmolLM2-135M-Instruct (the folder
   `make real-model` builds), from the start model itself, at staleness 0 and 1 in the recipe's placement (one
   policy rank and one rollout worker at two threads each) and in "1+1", a few steps each (a step takes tens of
   seconds here, so staleness 2 is left to the tiny model; rl.kl_coef 0.02: REAL_RL): tokens/s, ratios, median
   step and idle shares. No
   held-out accuracy: a few steps at the recipe's lr 1e-6 leave greedy where it starts (the real-model gain is
   bench/real_model.py's).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

SETTINGS = (("recipe", 0), ("recipe", 1), ("recipe", 2), ("1+1", 0), ("1+1", 1), ("2+1", 0), ("2+1", 1))


def _placement(recipe, name: str):
    """'recipe', or 'p+r': p policy ranks at one thread each and a rollout worker at r threads."""
    if name == "recipe":
        return recipe.placement
    p, r = (int(x) for x in name.split("+"))
    return replace(recipe.placement, policy_workers=p, torch_threads=1, rollout_threads=r)


def compare(steps: int | None, reps: int = 2, settings=SETTINGS) -> dict:
    import rl_vs_trl

    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.recipes import tiny_cpu

    recipe = tiny_cpu()
    store = ArtifactStore(rl_vs_trl.cache_dir() / "store")
    model_ref, ds_ref = rl_vs_trl.start_checkpoint(recipe, store)

    def greedy(ref) -> float:
        return stages.evaluate(recipe.eval, recipe.reward, model=ref, dataset=ds_ref, run_id="bench-rl-async",
                               store=store).greedy_accuracy

    rounds = []
    for rep in range(reps):
        rows = {}
        for placement, k in settings:
            rl_cfg = replace(recipe.rl, checkpoint_every=0, max_staleness=k, **({"steps": steps} if steps else {}))
            run_recipe = replace(recipe, placement=_placement(recipe, placement))
            print(f"\n== round {rep + 1}/{reps}: placement {placement}, rl.max_staleness {k}, {rl_cfg.steps} steps ==",
                  flush=True)
            r, hist = _timed_run(run_recipe, rl_cfg, store, model_ref, ds_ref)
            first = next((i for i, h in enumerate(hist) if h.accuracy >= 0.95), None)
            r["to_095"] = (first + 1, sum(h.step_s for h in hist[:first + 1])) if first is not None else None
            if rep == 0:
                r["greedy"] = greedy(r["model"])
            rows[(placement, k)] = r
        rounds.append(rows)
    return {"start": greedy(model_ref), "rounds": rounds, "rl": replace(recipe.rl, **({"steps": steps} if steps else {})),
            "settings": settings}


REAL_SETTINGS = (("recipe", 0), ("recipe", 1), ("1+1", 0), ("1+1", 1))


def _timed_run(run_recipe, rl_cfg, store, model_ref, ds_ref) -> tuple[dict, list]:
    """(the run's figures, its step history): tokens/s over the steps' wall, and the median step, phases and
    idle shares of the steps after the first (the warm-up)."""
    import rl_vs_trl

    r = rl_vs_trl.run_project(run_recipe, rl_cfg, store, model_ref, ds_ref)
    hist = r.pop("history")
    steady = hist[1:] or hist
    r["tok_s"] = r["tokens"] / r["wall_s"]
    r["median_step_s"] = statistics.median(h.step_s for h in steady)
    r["phase_s"] = {p: statistics.median(h.phase_s.get(p, 0.0) for h in steady)
                    for p in sorted({p for h in hist for p in h.phase_s})}
    r["idle_update"] = statistics.fmean(h.extra.get("idle/update", 0.0) for h in steady)
    r["idle_rollout"] = statistics.fmean(h.extra.get("idle/rollout", 0.0) for h in steady)
    return r, hist


def _cells(rounds: list[dict], placement: str, k: int, step_digits: int) -> list[str]:
    """A setting's cells both tables share: placement, staleness, tok/s (median over rounds), x the same
    placement's sync per round, median step s, idle update, idle rollout."""
    runs = [r[(placement, k)] for r in rounds]
    ratios = [r[(placement, k)]["tok_s"] / r[(placement, 0)]["tok_s"] for r in rounds if (placement, 0) in r]
    return [placement, str(k), f"{statistics.median(r['tok_s'] for r in runs):.0f}",
            " / ".join(f"x{x:.2f}" for x in ratios) or "-",
            f"{statistics.median(r['median_step_s'] for r in runs):.{step_digits}f}",
            f"{statistics.fmean(r['idle_update'] for r in runs):.2f}",
            f"{statistics.fmean(r['idle_rollout'] for r in runs):.2f}"]


REAL_RL = {"kl_coef": 0.02}
"""rl settings of the SmolLM2 runs over the recipe's: with its kl_coef 0 and the start model's reward 0 on the
first steps, every group's advantages are 0 and the update skips every row (nothing to overlap); with a KL term
every row has a gradient, as in a run that learns (the recipe's docs suggest ~0.02 for long runs)."""


def compare_real(steps: int, reps: int = 1, settings=REAL_SETTINGS, rl_overrides: dict | None = None) -> dict:
    """Item 5 of the module docstring: small_instruct_cpu on SmolLM2-135M-Instruct, from the start model."""
    import tempfile
    from pathlib import Path

    from posttrain.artifacts import ArtifactStore
    from posttrain.data.prepare import prepare_dataset
    from posttrain.recipes import small_instruct_cpu

    recipe = small_instruct_cpu()
    base_rl = replace(recipe.rl, steps=steps, **(REAL_RL if rl_overrides is None else rl_overrides))
    model_dir = Path(recipe.model.base_path)
    if not (model_dir / "config.json").exists():
        raise SystemExit(f"{model_dir}: no SmolLM2-135M-Instruct folder - `make real-model` builds it")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-rl-async-real-") as tmp:
        root = Path(tmp)
        prepare_dataset(recipe.data, root / "dataset", require_completions=False)
        store = ArtifactStore(root / "store")
        model_ref = store.put("model", "start", model_dir, run_id="bench-rl-async", parents=[], config={})
        ds_ref = store.put("dataset", "data", root / "dataset", run_id="bench-rl-async", parents=[], config={})
        for rep in range(reps):
            rows = {}
            for placement, k in settings:
                rl_cfg = replace(base_rl, checkpoint_every=0, max_staleness=k)
                print(f"\n== SmolLM2 round {rep + 1}/{reps}: placement {placement}, rl.max_staleness {k}, {steps} "
                      "steps ==", flush=True)
                rows[(placement, k)], _ = _timed_run(replace(recipe, placement=_placement(recipe, placement)),
                                                     rl_cfg, store, model_ref, ds_ref)
            rounds.append(rows)
    return {"rl": base_rl, "rounds": rounds, "settings": settings}


def print_real(res: dict) -> None:
    rl, rounds, settings = res["rl"], res["rounds"], res["settings"]
    print(f"\n## async on a real model: small_instruct_cpu, SmolLM2-135M-Instruct -> GRPO, {rl.steps} steps x "
          f"{rl.prompts_per_step} prompts x {rl.samples_per_prompt} samples, up to {rl.max_new_tokens} new tokens, "
          f"kl_coef {rl.kl_coef:g}; "
          f"{len(rounds)} rounds in turn")
    print("| placement | rl.max_staleness | generated tok/s (median over rounds) | x sync, same placement (per round) | "
          "x recipe sync (per round) | median step s | idle update | idle rollout |")
    print("|---|---|---|---|---|---|---|---|")
    for placement, k in settings:
        base = [r[(placement, k)]["tok_s"] / r[("recipe", 0)]["tok_s"] for r in rounds if ("recipe", 0) in r]
        cells = _cells(rounds, placement, k, step_digits=2)
        print("| " + " | ".join(cells[:4] + [" / ".join(f"x{x:.2f}" for x in base) or "-"] + cells[4:]) + " |")


def print_section(res: dict) -> None:
    rl, rounds, settings = res["rl"], res["rounds"], res["settings"]
    print(f"\n## async: tiny_cpu SFT model (held-out greedy {res['start']:.3f}) -> GRPO, {rl.steps} steps x "
          f"{rl.prompts_per_step} prompts x {rl.samples_per_prompt} samples; {len(rounds)} rounds in turn")
    print("| placement | rl.max_staleness | generated tok/s (median over rounds) | x sync, same placement (per round) | "
          "median step s | idle update | idle rollout | train acc >= 0.95 at step (s) | held-out greedy (round 1) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for placement, k in settings:
        first = rounds[0][(placement, k)]
        reach = f"{first['to_095'][0]} ({first['to_095'][1]:.0f} s)" if first["to_095"] else "never"
        print("| " + " | ".join(_cells(rounds, placement, k, step_digits=3) + [reach, f"{first['greedy']:.3f}"])
              + " |")
    if ("recipe", 0) in rounds[0]:
        from rl_async_projection import print_projection

        print_projection(rounds[0][("recipe", 0)]["phase_s"])
