"""The project's DPO against TRL's DPOTrainer on identical work, from the tiny_cpu recipe's own SFT model.

    .venv/bin/python bench/dense.py                 # 75 steps x 64 pairs (~4,900 pairs from the SFT model's samples)
    .venv/bin/python bench/dense.py --quick         # smoke run: 10 steps, ~500 pairs (timings meaningless)
    .venv/bin/python bench/dense.py --steps 40 --threads 2 --seed 1

1. Start model: the tiny_cpu recipe's SFT model exactly as `make run` makes it (bench/rl_vs_trl.py's
   start_checkpoint: stages.data_prep, then stages.sft with the recipe's settings on its sft.nproc = 2 gloo ranks
   under torch.distributed.run), in the bench store that bench/rl_vs_trl.py uses (~/.cache/posttrain/bench/rl-trl/
   store, or $POSTTRAIN_BENCH_CACHE/store), so the two benchmarks share one cached SFT model. The recipe's 2 ranks
   rather than 1: the model is then the default pipeline's own, and ranks change only float rounding.
2. Pairs: stages.pairs(PairsConfig(samples_per_prompt=4, max_new_tokens=8), RewardConfig()) - the SFT
   model's own
   4 samples of every train prompt (~9,900), scored by the built-in verifier; a prompt with a right and a wrong
   sample gives one pair (~4,900). --quick: the first 1,000 prompts (~500 pairs). Cached by the stage.
3. Project: stages.train(recipe.model, DPOConfig(steps 75, global batch 64 pairs, micro 32, lr 2e-5, beta 0.1,
   warm-up 0, cosine to lr x 0.1 (min_lr_ratio, the default), nproc 1, save_every 0), start = the SFT model,
   which is also the reference) in THIS process, with --threads torch threads. Its cache entry and any saved
   state are dropped first, so every run trains (and is timed) afresh. Packing stays on (the project's default).
   Train wall time: the trainer's own loop time (metric wall_s: the steps and the final state save); tokens: the
   non-pad tokens of every step's chosen + rejected sequences (the trainer's per-step `tokens`), summed over
   steps from the same order the trainer uses (checked against the last step's metric).
4. TRL: DPOTrainer (trl 1.16.0, installed by rl_vs_trl.install_trl into the bench cache with --no-deps) in a
   subprocess, `.venv/bin/python bench/dense_trl.py IN.json OUT.json` with that folder on PYTHONPATH and
   --threads torch threads, on the same pairs in the same order (the project's epoch permutation, handed over
   row by row; TRL samples sequentially) and the same micro-batches, the project's optimizer and lr schedule;
   every setting and the differences left are listed in bench/dense_trl.py's docstring. Its model is stored
   in the bench store as a `model` artifact. Train wall time: TRL's train(); tokens: its num_tokens.
5. Both models and the start model are scored by stages.evaluate with the recipe's eval settings (500 held-out
   problems, greedy and k=4 sampled, 8 new tokens). Printed: a table with train time, tokens, tokens/s,
   median step time, held-out accuracy before -> after and the load average before and after each run;
   written: bench/results/dense-<date>[-quick].json. Headline: project / TRL tokens/s (target >= 1.3x with an
   equal or better held-out gain).

Measured 2026-11-25 (this 2-core CPU, 2 threads each, load 1.8-1.9, `--repeats 3`): 4,890 pairs, 163,200 tokens
each; 19.2k vs 11.7k tokens/s (x1.63; every run: 17.8k / 19.2k / 22.6k vs 9.4k / 11.7k / 12.0k; median step
0.111 vs 0.177 s); both greedy 0.434 -> 0.978, sampled 0.680 -> 0.722; the per-step losses of the two trainers
agree within 9e-8 (identical work). Most of the gain is the shared prompt (`dpo.share_prompt`, the default: a
pair is one row, prompt once, ~1/3 fewer tokens through the model here); before it, with two rows per pair as
TRL lays them out (and a world of one still wrapped in DDP), the same day's 5 runs gave x1.19 (14.1k vs 11.8k). The project's tokens count each sequence whole, as
TRL's do: tokens/s is work per second, not positions computed.

Run ONE benchmark at a time on an otherwise idle machine: both trainers compete for the same 2 cores.
Leaves out: several seeds (use --seed), multi-rank DPO, IPO/RPO variants, TRL's precomputed reference log-probs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ siblings: rl_vs_trl

from rl_vs_trl import ROOT, TRL_PINS, cache_dir, install_trl, start_checkpoint

RUN_ID = "bench-dense"
DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""Set in this process by the project's trainer (a world of one); kept away from the TRL process."""


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def pairs_dataset(sft_ref, ds_ref, store, quick: bool):
    from posttrain import stages
    from posttrain.config import PairsConfig, RewardConfig

    cfg = PairsConfig(samples_per_prompt=4, max_new_tokens=8, max_prompts=1000 if quick else 0)
    return stages.pairs(cfg, RewardConfig(), model=sft_ref, dataset=ds_ref, run_id=RUN_ID, store=store)


def step_order(n: int, cfg) -> list[list[int]]:
    """The pair indices of every step, as the trainer's Shards deals them on one rank: per epoch a seeded
    permutation (rank_order), cut into consecutive global batches; a partial batch at an epoch's end is skipped."""
    from posttrain.sft.batching import rank_order

    per_epoch = n // cfg.global_batch_size
    steps, orders = [], {}
    for step in range(cfg.steps):
        epoch, k = divmod(step, per_epoch)
        order = orders.setdefault(epoch, rank_order(n, epoch, cfg.seed, 0, 1))
        steps.append(order[k * cfg.global_batch_size:(k + 1) * cfg.global_batch_size])
    return steps


def encoded_pairs(recipe, sft_dir: Path, pairs_dir: Path):
    """(the train pairs the project trains on, their (chosen, rejected) sequences), as its trainer encodes them."""
    from posttrain.config import DPOConfig
    from posttrain.data.examples import read_examples
    from posttrain.models.io import load_tokenizer
    from posttrain.sft.objectives import DPOObjective

    tok, obj, max_len = load_tokenizer(sft_dir), DPOObjective(DPOConfig()), recipe.model.max_seq_len
    pairs = [ex for ex in read_examples(pairs_dir, "train") if obj.trains_on(ex)]
    enc = [obj.encode(ex, tok, max_len) for ex in pairs]
    if any(e is None for e in enc):  # the trainer would drop them; TRL would truncate: keep the work identical
        raise SystemExit(f"{sum(e is None for e in enc)} pairs are longer than model.max_seq_len={max_len}")
    return pairs, enc


def run_project(recipe, dpo_cfg, store, sft_ref, pairs_ref, enc, order, threads: int) -> dict:
    import torch

    from posttrain import stages
    from posttrain.artifacts.state import StateDir
    from posttrain.config import TrackingConfig

    key = stages.sft_cache_key(store, recipe.model, dpo_cfg, pairs_ref, None, sft_ref, sft_ref)
    (Path(store.root) / "cache" / f"{key}.json").unlink(missing_ok=True)  # train afresh: this run is timed
    StateDir.under_store(store.root, "dpo", key).drop()  # and never resume a killed run's state
    os.environ["OMP_NUM_THREADS"] = str(threads)  # run_sft sets torch's threads from it
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    with _this_runs_metrics() as m:
        ref = stages.train(recipe.model, dpo_cfg, TrackingConfig(wandb=False, log_every=25), dataset=pairs_ref,
                           tokenizer=None, run_id=RUN_ID, start=sft_ref, store=store)
    total = time.perf_counter() - t0
    hist = m["history"]
    step_tokens = [sum(len(s[0]) for i in idx for s in enc[i]) for idx in order]
    if step_tokens[-1] != m["tokens"]:
        raise SystemExit(f"the trainer's last step had {m['tokens']} tokens, the bench's order "
                         f"{step_tokens[-1]}: the order the bench hands TRL is not the trainer's")
    return {"model": ref, "wall_s": m["wall_s"], "total_s": total, "tokens": sum(step_tokens),
            "step_s": [t / h["tokens_per_s"] for t, h in zip(step_tokens, hist)], "loss": [h["loss"] for h in hist],
            "accuracy": [h["accuracy"] for h in hist], "torch_threads": threads}


@contextmanager
def _this_runs_metrics():
    """The metrics (and per-step history) that THIS run's trainer returns. Not the stored manifest's: training is
    deterministic here, so a rerun produces the same weights, the store returns the existing artifact, and its
    manifest keeps the FIRST run's timings (an earlier version of this bench reported those on every rerun)."""
    from posttrain import sft

    seen: dict = {}
    real = sft.run_sft  # stages.train imports it from posttrain.sft at call time

    def run_sft(**kw):
        out = real(**kw)
        seen.update(out)  # before stages pops "history" from it
        return out

    sft.run_sft = run_sft
    try:
        yield seen
    finally:
        sft.run_sft = real


def trl_rows(pairs: list[dict], enc, order) -> list[dict]:
    """The pairs in the order the project's trainer visits them, in TRL's conversational preference format."""
    rows = []
    for idx in order:
        for i in idx:
            ex, (chosen, rejected) = pairs[i], enc[i]
            rows.append({"prompt": ex["messages"], "chosen": ex["chosen"], "rejected": ex["rejected"],
                         "chosen_ids": chosen[0], "chosen_mask": chosen[1],
                         "rejected_ids": rejected[0], "rejected_mask": rejected[1]})
    return rows


def run_trl(dpo_cfg, store, sft_ref, pairs_ref, rows: list[dict], threads: int) -> dict:
    from posttrain.config import to_dict

    site = install_trl()
    with tempfile.TemporaryDirectory(prefix="bench-dense-trl-") as tmp:
        spec = {"model_dir": str(store.get(sft_ref)), "out_dir": tmp, "threads": threads, "seed": dpo_cfg.seed,
                "dpo": to_dict(dpo_cfg), "rows": rows}
        (Path(tmp) / "in.json").write_text(json.dumps(spec))
        env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
        env.update(PYTHONPATH=str(site), WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
                   HF_HUB_DISABLE_TELEMETRY="1", OMP_NUM_THREADS=str(threads))
        t0 = time.perf_counter()  # the process end to end: imports, model load, tokenization, train, save
        subprocess.run([str(ROOT / ".venv/bin/python"), str(ROOT / "bench/dense_trl.py"), f"{tmp}/in.json",
                        f"{tmp}/out.json"], cwd=ROOT, env=env, check=True)
        total = time.perf_counter() - t0
        out = json.loads((Path(tmp) / "out.json").read_text())
        ref = store.put("model", "trl-dpo", Path(tmp) / "model", run_id=RUN_ID, parents=[sft_ref.id, pairs_ref.id],
                        config={"dpo": to_dict(dpo_cfg), "trainer": "trl"})
    if out["tokens"] != out["tokens_counted"]:
        print(f"note: TRL's num_tokens {out['tokens']} != the rows' non-pad tokens {out['tokens_counted']}")
    return {"model": ref, "wall_s": out["wall_s"], "total_s": total, "tokens": out["tokens"], "step_s": out["step_s"],
            "loss": out["loss"], "accuracy": out["accuracy"], "torch_threads": out["torch_threads"],
            "versions": out["versions"]}


def compare(steps: int, threads: int, seed: int, quick: bool, repeats: int) -> dict:
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.config import DPOConfig
    from posttrain.recipes import tiny_cpu

    recipe = tiny_cpu()
    store = ArtifactStore(cache_dir() / "store")
    sft_ref, ds_ref = start_checkpoint(recipe, store)
    pairs_ref = pairs_dataset(sft_ref, ds_ref, store, quick)
    dpo_cfg = DPOConfig(steps=steps, global_batch_size=64, micro_batch_size=32, lr=2e-5, beta=0.1, warmup_steps=0,
                        min_lr_ratio=0.1, nproc=1, save_every=0, seed=seed)
    pairs, enc = encoded_pairs(recipe, store.get(sft_ref), store.get(pairs_ref))
    order = step_order(len(enc), dpo_cfg)

    def acc(ref):
        e = stages.evaluate(recipe.eval, recipe.reward, model=ref, dataset=ds_ref, run_id=RUN_ID, store=store)
        return e.greedy_accuracy, e.sampled_accuracy

    start = acc(sft_ref)
    trainers = (("posttrain DPO", lambda: run_project(recipe, dpo_cfg, store, sft_ref, pairs_ref, enc, order,
                                                      threads)),
                ("TRL DPOTrainer", lambda: run_trl(dpo_cfg, store, sft_ref, pairs_ref, trl_rows(pairs, enc, order),
                                                   threads)))
    runs: dict[str, list[dict]] = {name: [] for name, _ in trainers}
    for rep in range(repeats):  # alternate the trainers, so a slow spell of the machine hits both
        for name, run in trainers:
            print(f"\n== {name}: {dpo_cfg.steps} steps x {dpo_cfg.global_batch_size} pairs (run {rep + 1}/{repeats})"
                  " ==", flush=True)
            load0 = load()
            r = run()
            r["load"] = [load0, load()]
            r["tok_s"] = r["tokens"] / r["wall_s"]
            r["median_step_s"] = statistics.median(r["step_s"])
            runs[name].append(r)
    rows = {}
    for name, rs in runs.items():
        if len({r["model"].id for r in rs}) != 1:  # the work is deterministic: a rerun must train the same weights
            print(f"note: {name}'s runs trained different weights: {sorted({r['model'].short for r in rs})}")
        r = dict(sorted(rs, key=lambda r: r["tok_s"])[len(rs) // 2])  # the median run by tokens/s
        r["runs_tok_s"] = [x["tok_s"] for x in rs]
        r["after"] = acc(r["model"])
        rows[name] = r
    return {"recipe": recipe, "dpo": dpo_cfg, "start": start, "rows": rows, "num_pairs": len(enc),
            "sft": sft_ref, "pairs": pairs_ref, "repeats": repeats}


def report(res: dict, quick: bool) -> dict:
    dpo, (g0, s0), rows = res["dpo"], res["start"], res["rows"]
    print(f"\n## dense: tiny_cpu SFT model -> DPO, {dpo.steps} steps x {dpo.global_batch_size} pairs (micro "
          f"{dpo.micro_batch_size}), lr {dpo.lr:g} cosine to x{dpo.min_lr_ratio:g}, warm-up {dpo.warmup_steps}, beta "
          f"{dpo.beta:g}, seed {dpo.seed}; {res['num_pairs']} pairs; held-out {res['recipe'].eval.num_problems} "
          f"problems, sampled k={res['recipe'].eval.k}")
    print("| trainer | train s | tokens | tokens/s | median step s | with set-up s | greedy start -> after (gain) | "
          "sampled start -> after (gain) | load before -> after |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        g1, s1 = r["after"]
        (a, _, _), (b, _, _) = r["load"]
        print(f"| {name} | {r['wall_s']:.1f} | {r['tokens']} | {r['tok_s']:.0f} | {r['median_step_s']:.3f} | "
              f"{r['total_s']:.1f} | {g0:.3f} -> {g1:.3f} ({g1 - g0:+.3f}) | {s0:.3f} -> {s1:.3f} ({s1 - s0:+.3f}) | "
              f"{a:.2f} -> {b:.2f} |")
    p, t = rows["posttrain DPO"], rows["TRL DPOTrainer"]
    ratio = p["tok_s"] / t["tok_s"]
    print(f"each row is the median of {res['repeats']} runs by tokens/s (alternating trainers); every run's tokens/s: "
          + "; ".join(f"{n} " + ", ".join(f"{x:.0f}" for x in r["runs_tok_s"]) for n, r in rows.items()))
    gain_p, gain_t = p["after"][0] - g0, t["after"][0] - g0
    print(f"posttrain / TRL: tokens/s x{ratio:.2f}, median step time x{p['median_step_s'] / t['median_step_s']:.2f}; "
          f"greedy gain {gain_p:+.3f} vs {gain_t:+.3f}, sampled gain {p['after'][1] - s0:+.3f} vs "
          f"{t['after'][1] - s0:+.3f}; first/last step loss {p['loss'][0]:.4f}/{p['loss'][-1]:.4f} vs "
          f"{t['loss'][0]:.4f}/{t['loss'][-1]:.4f}")
    print("train s: the project's training loop (its metric wall_s) / TRL's train(); with set-up: the stages.train "
          "call (model loads, encoding, loop, save, store) / the TRL process (imports, loads, tokenization, train, "
          f"save); load: 1-minute load average. Torch threads {p['torch_threads']} / {t['torch_threads']}; TRL side: "
          + ", ".join(f"{k} {v}" for k, v in t["versions"].items()))
    met = ratio >= 1.3 and gain_p >= gain_t
    print(f"target (tokens/s >= 1.3x TRL with an equal or better greedy gain): {'met' if met else 'not met'}"
          + (" (--quick: timings and gains not meaningful)" if quick else ""))

    def row(r):
        return {k: r[k] for k in ("wall_s", "total_s", "tokens", "tok_s", "median_step_s", "step_s", "loss",
                                  "accuracy", "load", "torch_threads", "runs_tok_s")} | {
            "model": r["model"].id, "greedy_after": r["after"][0], "sampled_after": r["after"][1]}

    from posttrain.config import to_dict

    return {"date": datetime.date.today().isoformat(), "quick": quick, "dpo": to_dict(dpo),
            "num_pairs": res["num_pairs"], "sft_model": res["sft"].id, "pairs_dataset": res["pairs"].id,
            "start": {"greedy": g0, "sampled": s0}, "rows": {n: row(r) for n, r in rows.items()},
            "ratio_tok_s": ratio, "target_met": met, "repeats": res["repeats"], "trl_pins": list(TRL_PINS), "trl_versions": t["versions"],
            "python": platform.python_version(), "cpus": os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=0, help="DPO steps (default 75; 10 with --quick)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of each trainer")
    ap.add_argument("--seed", type=int, default=0, help="DPO seed: the data order (both trainers) and TRL's seed")
    ap.add_argument("--quick", action="store_true", help="smoke run: 10 steps on ~500 pairs")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each trainer, alternating; the median counts")
    args = ap.parse_args(argv)
    steps = args.steps or (10 if args.quick else 75)
    t0 = time.perf_counter()
    res = compare(steps, args.threads, args.seed, args.quick, args.repeats)
    out = report(res, args.quick)
    out["bench_s"] = time.perf_counter() - t0
    path = ROOT / "bench" / "results" / f"dense-{out['date']}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written {path.relative_to(ROOT)} ({out['bench_s']:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
