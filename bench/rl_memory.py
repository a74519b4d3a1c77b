"""Peak memory of an RL run on a real 135M model, per role: the memory figures of docs/own-model.md come from this script.

    .venv/bin/python bench/rl_memory.py                     # small_instruct_cpu, SmolLM2-135M-Instruct, 3 steps
    .venv/bin/python bench/rl_memory.py --steps 2 --overrides '{"rl": {"kl_coef": 0.02}}'

Runs `run_rl` with the `small_instruct_cpu` recipe (its placement: 1 policy rank and 1 rollout worker at 2 torch threads; the
reference role only when rl.kl_coef > 0) on the SmolLM2-135M-Instruct folder that `make real-model` builds,
on a local Ray started here, and samples every process of this process tree (the driver, Ray's own
processes, every role actor and the reward function's child process) twice a second. Memory is PSS
(proportional set size, /proc/PID/smaps_rollup): pages shared between processes - libtorch, Ray's object
store - are divided among them, so the per-process figures add up to what the run really holds. It prints
the peak per role (the largest sum over that role's processes at one instant), the peak of the total, and
the load average. Roles are read from each process's title (`ray::PolicyWorker...`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHM_GLOB = "posttrain-weights-*"
"""Policy -> rollout weight files in shared memory (posttrain.rl.weight_transfer): RAM that no process's PSS
shows unless it has the file mapped (a rollout worker reading it does), so the sampler adds the part of their
size that no process maps (size - the PSS of every mapping of them) as a row of its own. Counted once either way."""

ROLES = (("PolicyWorker", "policy"), ("RolloutWorker", "rollout"), ("ReferenceWorker", "reference"),
         ("RewardWorker", "reward"), ("ControllerActor", "controller"), ("posttrain.rewards.sandbox", "reward function"),
         ("ray::IDLE", "idle Ray workers"))


SHM_ROOTS = (Path("/dev/shm"), Path(tempfile.gettempdir()))


def role_of(pid: int, cmdline: str) -> str:
    if pid == os.getpid():
        return "driver"
    for key, role in ROLES:
        if key in cmdline:
            return role
    return "Ray system" if ("ray" in cmdline or "gcs_server" in cmdline or "raylet" in cmdline) else "other"


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def shm_mapped_kib(pid: int) -> int:
    """PSS of this process's mappings of the shared-memory weight files (already inside its own PSS)."""
    total, inside = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:  # a mapping's header line
                    inside = "posttrain-weights-" in line
                elif inside and line.startswith("Pss:"):
                    total += int(line.split()[1])
    except OSError:
        pass
    return total


def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """Samples PSS of every process under this one, grouped by role, every `period_s`; keeps the peaks."""

    def __init__(self, period_s: float = 0.5, timeline: Path | None = None):
        super().__init__(daemon=True)
        self.timeline = timeline.open("w") if timeline else None
        self.t0 = time.perf_counter()
        self.period_s, self.stop = period_s, threading.Event()
        self.peak_role: dict[str, int] = defaultdict(int)
        self.peak_total, self.peak_total_split, self.samples = 0, {}, 0
        self.procs_at_peak = 0

    def run(self) -> None:
        while not self.stop.is_set():
            by_role: dict[str, int] = defaultdict(int)
            pids = descendants(os.getpid())
            mapped = 0
            for pid in pids:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                by_role[role_of(pid, cmd)] += pss_kib(pid)
                mapped += shm_mapped_kib(pid)
            files = sum(f.stat().st_size for root in SHM_ROOTS for f in root.glob(f"{SHM_GLOB}/*") if f.is_file())
            by_role["weight files in shared memory (unmapped part)"] = max(0, files // 1024 - mapped)
            total = sum(by_role.values())
            if self.timeline:
                self.timeline.write(json.dumps({"t": round(time.perf_counter() - self.t0, 2), **by_role}) + "\n")
            for r, v in by_role.items():
                self.peak_role[r] = max(self.peak_role[r], v)
            if total > self.peak_total:
                self.peak_total, self.peak_total_split, self.procs_at_peak = total, dict(by_role), len(pids)
            self.samples += 1
            self.stop.wait(self.period_s)


def measure(cfg, sampler: Sampler):
    """Run RL with `cfg` on a local Ray started here, sampling memory meanwhile: (its result, wall seconds, the
    model folder)."""
    import ray

    from posttrain.artifacts import ArtifactStore
    from posttrain.config import TrackingConfig
    from posttrain.data.prepare import prepare_dataset
    from posttrain.rl.run import run_rl

    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    with tempfile.TemporaryDirectory(prefix="bench-rl-memory-") as tmp:
        root = Path(tmp)
        prepare_dataset(cfg.data, root / "dataset", require_completions=False)
        store = ArtifactStore(root / "store")
        model_dir = Path(cfg.model.base_path)
        m = store.put("model", "start", model_dir, run_id="bench", parents=[], config={})
        d = store.put("dataset", "data", root / "dataset", run_id="bench", parents=[], config={})
        sampler.start()
        t0 = time.perf_counter()
        res = run_rl(rl_cfg=cfg.rl, reward_cfg=cfg.reward, model_cfg=cfg.model, placement_cfg=cfg.placement,
                     max_seq_len=cfg.model.max_seq_len, tracking_cfg=TrackingConfig(wandb=False, log_every=1),
                     start_model_dir=model_dir, dataset_dir=root / "dataset", store_root=str(store.root),
                     run_id="bench-memory", parents=[m.id, d.id], state_dir=root / "state", start_model_id=m.id)
        wall = time.perf_counter() - t0
        sampler.stop.set()
        sampler.join()
    ray.shutdown()
    return res, wall, model_dir


def report(cfg, model_dir: Path, sampler: Sampler, res, wall: float, json_path: Path | None) -> None:
    """The peaks per role and in total, the step times; the same as JSON into `json_path` when given."""
    gib = 1 / 2**20
    load = os.getloadavg()
    print(f"\nRL peak memory (PSS), recipe {cfg.name}, model {model_dir.name}, {cfg.rl.steps} steps of "
          f"{cfg.rl.prompts_per_step} prompts x {cfg.rl.samples_per_prompt} samples, {cfg.placement.policy_workers} "
          f"policy ranks, {cfg.placement.rollout_workers} rollout worker(s), kl_coef {cfg.rl.kl_coef}; "
          f"{sampler.samples} samples over {wall:.0f} s; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("| role | peak PSS (GiB) | at the total's peak (GiB) |")
    print("|---|---|---|")
    for role in sorted(sampler.peak_role, key=lambda r: -sampler.peak_role[r]):
        print(f"| {role} | {sampler.peak_role[role] * gib:.2f} | {sampler.peak_total_split.get(role, 0) * gib:.2f} |")
    print(f"| **total** | **{sampler.peak_total * gib:.2f}** | {sampler.procs_at_peak} processes |")
    step_s = [m.step_s for m in res.history]
    print(f"steps: {len(res.history)}, final policy version {res.history[-1].policy_version if res.history else 0}; "
          f"step seconds {[round(s, 1) for s in step_s]}")
    if json_path:
        json_path.write_text(json.dumps({
            "recipe": cfg.name, "model": model_dir.name, "lora": bool(cfg.model.lora), "steps": len(step_s),
            "step_s": step_s, "peak_total_gib": sampler.peak_total * gib,
            "peak_role_gib": {r: v * gib for r, v in sampler.peak_role.items()},
            "at_peak_gib": {r: v * gib for r, v in sampler.peak_total_split.items()},
            "update_s": [m.compute_s.get("update", 0.0) for m in res.history],
            "rollout_s": [m.compute_s.get("rollout", 0.0) for m in res.history], "load": list(load)}, indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--recipe", default="small_instruct_cpu")
    ap.add_argument("--overrides", default="{}", help="JSON overrides of the recipe")
    ap.add_argument("--timeline", default="", help="write every sample (seconds, KiB per role) to this jsonl file")
    ap.add_argument("--json", default="", help="also write the peaks, step times and settings to this file")
    args = ap.parse_args(argv)


    from posttrain.models.smollm2 import build
    from posttrain.recipes import resolve

    over = json.loads(args.overrides)
    over.setdefault("rl", {}).setdefault("steps", args.steps)
    over["rl"].setdefault("checkpoint_every", 0)
    if args.recipe == "small_instruct_cpu" and not over.get("model", {}).get("base_path"):
        over.setdefault("model", {})["base_path"] = str(build())
    cfg = resolve(args.recipe, over)
    sampler = Sampler(timeline=Path(args.timeline) if args.timeline else None)
    res, wall, model_dir = measure(cfg, sampler)
    report(cfg, model_dir, sampler, res, wall, Path(args.json) if args.json else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
