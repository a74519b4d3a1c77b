"""Chaos run (not in CI): the short pipeline, through `pyflyte run`, killed with SIGKILL at random points and
re-run after each kill, until at least `--kills` kills; then checks that nothing was lost, repeated or
half-written.

    python bench/chaos.py --kills 20 --seed 0          # ~30-40 min on 2 cores
    python bench/chaos.py --kills 8 --kinds actor      # one Ray actor at a time, each role in turn

It runs the code of the checkout it sits in (PYTHONPATH), so a clone can be tortured while its source is edited.

1. Reference: one uninterrupted run in a fresh store: its wall time T and its artifact ids.
2. Cycles, each in a fresh store: run the pipeline; per attempt one kill, of a kind drawn in turn:
   - `run`: the whole run (every process of it: pyflyte, SFT ranks, the local Ray cluster and its actors,
     reward sandboxes) at a uniform random time in [1 s, T];
   - `store`: the whole run the moment a new store write is staged (a new folder in the store's tmp/);
   - `actor`: ONE Ray actor of the next role in turn (rollout, reward, reference, policy), a few seconds after
     RL's actors appear; the run must survive it (rl.max_restarts) - it is not re-run.
   A killed run is re-run with the same command; a cycle ends when a run finishes.
3. After every cycle: the run's SFT and RL model ids equal the reference's, and so do its evaluations' scores
   (an eval artifact's id differs run to run: its report records the measured generation time);
   `posttrain verify` passes on every artifact; no object folder lacks its manifest; the store's tmp/ and
   state/ are empty (no half-written artifact, no leftover state); no process of the run is left.
The report (stdout and bench/results/chaos-<seed>.json) lists every kill with where it landed (the run's last
output line) and what the checks found.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYFLYTE = str(Path(sys.executable).parent / "pyflyte")
POSTTRAIN = str(Path(sys.executable).parent / "posttrain")
SHORT = {"data": {"num_examples": 4000, "eval_size": 100}, "sft": {"steps": 300, "save_every": 50},
         "eval": {"num_problems": 100},
         "rl": {"steps": 12, "checkpoint_every": 3, "prompts_per_step": 32, "kl_coef": 0.02}}
"""The short pipeline: tiny_cpu with fewer steps and problems, and a KL term so that a reference role exists."""
ROLES = ["RolloutWorker", "RewardWorker", "ReferenceWorker", "PolicyWorker"]
KINDS = ["run", "store", "actor"]
ID_FIELDS = ("sft_model_id", "sft_eval_id", "rl_model_id", "rl_eval_id")
SCORES = ("greedy_accuracy", "sampled_accuracy", "pass_at_k", "num_problems", "reward_failures")


# --------------------------------------------------------------------------------------------- processes


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def marked(token: str) -> list[int]:
    """Every process carrying this run's marker in its environment: the pipeline, its SFT ranks, the local Ray
    cluster it started and every Ray worker (they inherit the raylet's environment), reward sandboxes."""
    mark = f"POSTTRAIN_CHAOS={token}".encode()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()
            and mark in _environ(int(p)).split(b"\0")]


def kill_all(token: str, timeout_s: float = 30.0) -> int:
    """SIGKILL every marked process until none is left; returns how many were killed."""
    killed: set[int] = set()
    deadline = time.time() + timeout_s
    while pids := marked(token):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        if time.time() > deadline:
            raise RuntimeError(f"processes of the run survive SIGKILL: {pids}")
        time.sleep(0.2)
    return len(killed)


def actor_pid(token: str, role: str) -> int | None:
    """A live Ray actor process of this role (its process title is `ray::<Role>...`)."""
    for pid in marked(token):
        if _cmdline(pid).startswith(f"ray::{role}"):
            return pid
    return None


# --------------------------------------------------------------------------------------------- one attempt


class Attempt:
    """One `pyflyte run` of the short pipeline in `home`, its output teed into `log` and its last line kept."""

    def __init__(self, home: Path, log: Path, token: str):
        self.token, self.home = token, home
        env = {**os.environ, "POSTTRAIN_HOME": str(home), "POSTTRAIN_CHAOS": token, "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled",
               "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",  # this checkout's code, whatever the venv's install points at
               "TMPDIR": str(home.parent / "t")}  # Ray's session files too (short: socket paths <= 107 bytes)
        Path(env["TMPDIR"]).mkdir(exist_ok=True)
        self.proc = subprocess.Popen([PYFLYTE, "run", "workflows/pipeline.py", "pipeline", "--overrides",
                                      json.dumps(SHORT)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.t0, self.last, self.lines = time.time(), "", []
        self._log = open(log, "a")  # noqa: SIM115 - closed in wait()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            self.lines.append(line)
            if line.strip():
                self.last = line.strip()[:160]

    def done(self) -> bool:
        return self.proc.poll() is not None

    def wait(self) -> int:
        rc = self.proc.wait()
        self._reader.join(30)
        self._log.close()
        return rc

    def ids(self) -> dict:
        """The Summary's artifact ids, from pyflyte's printout of the workflow output."""
        text = "".join(self.lines)
        return {k: v for k, v in re.findall(r"(\w+_id)='([0-9a-f]{64})'", text) if k in ID_FIELDS}


def _staged(home: Path) -> set[str]:
    """The store's staging folders now (a store write in progress, or one a killed write left behind)."""
    tmp = home / "tmp"
    return set(os.listdir(tmp)) if tmp.exists() else set()


def attempt(home: Path, log: Path, kind: str, role: str, t_ref: float, rng: random.Random) -> dict:
    """Run once, applying one kill of `kind`; returns what happened."""
    token = f"{os.getpid()}-{time.time_ns()}"
    a = Attempt(home, log, token)
    at = rng.uniform(1.0, t_ref)
    event: dict = {"kind": kind}
    rl_seen, before = None, _staged(home)
    while not a.done():
        now = time.time() - a.t0
        if kind == "run" and now >= at or kind == "store" and _staged(home) - before:
            event.update(at_s=round(now, 1), last_line=a.last, processes=kill_all(token))
            break
        if kind == "actor" and "role_killed" not in event:
            pid = actor_pid(token, role)
            if pid is not None and rl_seen is None:
                rl_seen, wait_s = time.time(), rng.uniform(0.5, 5.0)  # the short run's RL lasts ~10-20 s
            if pid is not None and time.time() - rl_seen >= wait_s:
                os.kill(pid, signal.SIGKILL)
                event.update(at_s=round(now, 1), last_line=a.last, role_killed=role, pid=pid)
        time.sleep(0.02)
    rc = a.wait()
    event["rc"] = rc
    event["finished"] = rc == 0 and "processes" not in event
    if event["finished"]:
        event["ids"] = a.ids()
    if "processes" not in event:
        event["left_over"] = kill_all(token)  # a finished or failed run must leave no process behind
    event["wall_s"] = round(time.time() - a.t0, 1)
    return event


# --------------------------------------------------------------------------------------------- checks


def outcome(home: Path, ids: dict) -> dict:
    """What must not depend on the kills: the model ids and the evaluations' scores."""
    sys.path.insert(0, str(ROOT / "src"))
    from posttrain.artifacts import ArtifactStore

    store = ArtifactStore(home)
    return {"sft_model_id": ids["sft_model_id"], "rl_model_id": ids["rl_model_id"],
            **{f"{e}.{k}": store.manifest(ids[f"{e}_id"]).metrics.get(k) for e in ("sft_eval", "rl_eval")
               for k in SCORES}}


def check_store(home: Path) -> dict:
    """`posttrain verify` on every artifact; objects without a manifest; leftovers in tmp/ and state/."""
    env = {**os.environ, "POSTTRAIN_HOME": str(home)}
    listed = subprocess.run([POSTTRAIN, "artifacts", "list", "--json"], capture_output=True, text=True, env=env,
                            check=False)
    ids = [a["id"] for a in json.loads(listed.stdout)] if listed.returncode == 0 else []
    bad = []
    for id_ in ids:
        v = subprocess.run([POSTTRAIN, "verify", id_], capture_output=True, text=True, env=env, check=False)
        if v.returncode != 0:
            bad.append({"id": id_, "error": (v.stdout + v.stderr).strip()[-300:]})
    objects = home / "objects"
    no_manifest = [d.name for d in objects.iterdir() if not (d / "manifest.json").exists()] if objects.exists() else []
    tmp = sorted(p.name for p in (home / "tmp").iterdir()) if (home / "tmp").exists() else []
    state = sorted(str(p.relative_to(home)) for p in (home / "state").glob("*/*/*")) if (home / "state").exists() else []
    return {"artifacts": len(ids), "list_ok": listed.returncode == 0, "verify_failed": bad,
            "objects_without_manifest": no_manifest, "tmp_left": tmp, "state_left": state}


def run_cycle(c: int, work: Path, turns: dict, kinds: list[str], t_ref: float, expected: dict, rng: random.Random,
              max_attempts: int) -> tuple[dict, list[dict]]:
    """One fresh store: kill attempts (kinds and actor roles taken in turn, `turns` counts them across cycles)
    until a run finishes, then compare its outcome with the reference and check the store."""
    home = work / f"cycle-{c}" / "home"
    home.mkdir(parents=True)
    cycle, events = {"cycle": c, "attempts": 0}, []
    while True:
        kind, role = kinds[turns["kind"] % len(kinds)], ROLES[turns["role"] % len(ROLES)]
        e = attempt(home, work / f"cycle-{c}" / "log.txt", kind, role, t_ref, rng)
        e["cycle"] = c
        turns["kind"] += 1
        cycle["attempts"] += 1
        killed = "processes" in e or "role_killed" in e
        turns["kills"] += killed
        turns["role"] += "role_killed" in e
        events.append(e)
        print(f"chaos: cycle {c} attempt {cycle['attempts']}: {kind}"
              + (f" {e.get('role_killed', '')} at {e['at_s']} s after '{e['last_line']}'" if killed else "")
              + f" -> rc {e['rc']}{' finished' if e['finished'] else ''} (kills so far {turns['kills']})", flush=True)
        if e["finished"]:
            got = outcome(home, e["ids"])
            cycle.update(same_outcome=got == expected, left_over=e.get("left_over", 0),
                         differs={k: (expected[k], v) for k, v in got.items() if v != expected[k]})
            break
        if cycle["attempts"] > max_attempts:
            cycle["gave_up"] = True
            break
    cycle.update(check_store(home))
    print(f"chaos: cycle {c}: {json.dumps(cycle)}", flush=True)
    return cycle, events


def cycle_ok(c: dict) -> bool:
    """The run finished with the reference's outcome and left a clean, verified store."""
    return bool(c.get("same_outcome") and c["list_ok"] and not c["verify_failed"] and not c["objects_without_manifest"]
                and not c["tmp_left"] and not c["state_left"] and not c.get("left_over"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"kill kinds to take in turn (of {KINDS})")
    ap.add_argument("--workdir", default="", help="default: a new temporary folder (kept, for the logs)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    kinds = args.kinds.split(",")
    if not kinds or set(kinds) - set(KINDS):
        ap.error(f"--kinds: {args.kinds!r}: each must be one of {KINDS}")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="chaos-"))
    print(f"chaos: work folder {work}; load average {os.getloadavg()[0]:.2f}", flush=True)

    ref_home = work / "reference" / "home"
    ref_home.mkdir(parents=True)
    ref = attempt(ref_home, work / "reference" / "log.txt", "none", "", 1e9, rng)
    if not ref["finished"] or len(ref["ids"]) != len(ID_FIELDS):
        print(f"chaos: the reference run failed: {ref}; see {work / 'reference' / 'log.txt'}")
        return 1
    t_ref, expected = ref["wall_s"], outcome(ref_home, ref["ids"])
    print(f"chaos: reference run {t_ref:.0f} s: {expected}", flush=True)

    events, cycles, turns = [], [], {"kind": 0, "role": 0, "kills": 0}
    while turns["kills"] < args.kills:
        cycle, cycle_events = run_cycle(len(cycles), work, turns, kinds, t_ref, expected, rng, 3 * args.kills)
        cycles.append(cycle)
        events.extend(cycle_events)

    ok = all(cycle_ok(c) for c in cycles)
    by_kind = {k: sum(1 for e in events if e["kind"] == k and ("processes" in e or "role_killed" in e))
               for k in KINDS}
    report = {"seed": args.seed, "kinds": kinds, "kills": turns["kills"], "by_kind": by_kind, "reference": ref,
              "cycles": cycles, "events": events, "ok": ok, "load_average": os.getloadavg()[0]}
    out = ROOT / "bench" / "results" / f"chaos-{args.seed}-{'-'.join(kinds)}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"chaos: {turns['kills']} kills ({by_kind}) over {len(cycles)} cycles; every check passed: {ok}; report {out}")
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
