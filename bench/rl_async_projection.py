"""A projection of rollout ahead of the update (rl.max_staleness) from this machine to a GPU cluster: a small
event simulation of the controller's pipeline, fed with a synchronous run's measured phase times, then with the
rollout and update durations scaled as the peers report them for GPU clusters.

The pipeline simulated is the one rl/ahead.py runs: ONE rollout queue (generations and weight loads in the
order they were queued); step s takes draw s, launches draw s + k on the queue, waits for draw s's generation,
scores and updates, waits for the previous version's load to finish, publishes the new version and queues its
load. k = 0 is the synchronous loop: generate, score, update, publish, load, one after the other.

Assumptions, stated because the projection stands on them:
- the rollout and the policy have devices of their own (on a cluster: GPU groups; here: cores), so an overlapped
  generation runs as fast as it does alone - on 2 CPU cores it does not (bench/rl_async.py measures that);
- per-step generation time varies (long-tail response lengths): lognormal with the given spread around the mean;
  the update's and the rest's do not;
- scenarios "GPU, generation-bound" and "GPU, balanced" take the generation share of a synchronous step that the
  peers report for reasoning RL on GPUs: 70 % (verl's and AReaL's step breakdowns of long-CoT GRPO) and 50 %
  (short responses), with the rest split between the update (75 %) and reward / reference / sync (25 %).
"""

from __future__ import annotations

import random


def simulate(steps: int, k: int, gen: list[float], update: float, other: float, publish: float, load: float) -> float:
    """Wall seconds of `steps` steps with rollout ahead by k (0: synchronous); gen[d] is draw d's generation."""
    if k == 0:
        return sum(gen[s] + other + update + publish + load for s in range(steps))
    free = 0.0  # when the rollout queue is next idle

    def queue(at: float, seconds: float) -> float:
        nonlocal free
        free = max(at, free) + seconds
        return free

    done = {d: queue(0.0, gen[d]) for d in range(k)}
    loaded: dict[int, float] = {}
    t = 0.0
    for s in range(steps):
        done[s + k] = queue(t, gen[s + k])
        t = max(t, done[s]) + other + update
        t = max(t, loaded.get(s - 1, 0.0)) + publish
        loaded[s] = queue(t, load)
    return t


def project(rollout: float, update: float, other: float, sync: float, *, steps: int = 100, spread: float = 0.3,
            seed: int = 0) -> list[tuple[str, dict[int, float]]]:
    """[(scenario, {k: speed-up over k = 0})] from a synchronous step's phases (seconds): this machine's, then the
    two GPU scenarios of the module docstring (same total step time, the generation share changed)."""
    total = rollout + update + other + sync
    scenarios = [("this machine's phases, devices of their own", rollout, update, other, sync)]
    for name, share in (("GPU, generation-bound (70 % generation)", 0.7), ("GPU, balanced (50 % generation)", 0.5)):
        rest = (1 - share) * total
        scenarios.append((name, share * total, 0.75 * rest, 0.25 * rest * 0.6, 0.25 * rest * 0.4))
    out = []
    for name, g, u, o, sy in scenarios:
        rng = random.Random(seed)
        gens = [g * rng.lognormvariate(0.0, spread) / (2.718281828 ** (spread ** 2 / 2)) for _ in range(steps + 3)]
        base = simulate(steps, 0, gens, u, o, sy / 2, sy / 2)
        out.append((name, {k: base / simulate(steps, k, gens, u, o, sy / 2, sy / 2) for k in (1, 2)}))
    return out


def print_projection(phases: dict[str, float]) -> None:
    rollout, update, sync = phases.get("rollout", 0.0), phases.get("update", 0.0), phases.get("sync", 0.0)
    other = sum(v for k, v in phases.items() if k not in ("rollout", "update", "sync"))
    print(f"\nprojection (bench/rl_async_projection.py) from the synchronous run's median phases: generation "
          f"{rollout:.3f} s, update {update:.3f} s, other {other:.3f} s, sync {sync:.3f} s; 100 steps, generation "
          "time lognormal (spread 0.3)")
    print("| scenario | staleness 1 / sync | staleness 2 / sync |")
    print("|---|---|---|")
    for name, speed in project(rollout, update, other, sync):
        print(f"| {name} | x{speed[1]:.2f} | x{speed[2]:.2f} |")
    print("assumptions: see the module docstring (devices of their own per role; GPU shares from the peers' step "
          "breakdowns)")


if __name__ == "__main__":
    print_projection({"rollout": 0.6, "reward": 0.05, "advantages": 0.01, "update": 0.5, "sync": 0.05})
