"""agent_pipeline's stages in ONE process, for a machine without Flyte or Ray (the lent GPU machine's image has
neither): data prep -> SFT -> evaluation in the environment -> RL in the environment -> evaluation in the
environment, per seed, with the real role workers driven by the real `Controller` through `LocalActor` (as
tests/gpu/test_cuda_rl.py does). The same recipe, seeds and stages as `bench/default_seeds.py --workflow
agent_pipeline`; what differs is the orchestration (no Flyte cache, no Ray actors) and, on a GPU, the
precision (bf16 rollouts and reference, fp32 policy with bf16 autocast).

    python bench/agent_inprocess.py --recipe tiny_guess_number --seeds 0 1 2 [--device cuda] [--rl-steps 60]

Prints one line per seed (SFT and RL held-out greedy / sampled accuracy in the environment, the RL model
without it, seconds per stage) and a table at the end. CPU: expect the pipeline's own time (~10-15 min a seed).

    python bench/agent_inprocess.py --rows-from bench/results/guess-number-methods*-cpu-2026-11-29.txt --write-docs

makes the table of kept runs (the JSON rows of their outputs; no new run) and writes it into docs/agents.md's
`agent_methods` block.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from posttrain import recipes
from posttrain.artifacts import ArtifactStore
from posttrain.config import Backend, DType, EpisodeConfig, TrackingConfig
from posttrain.data.examples import read_examples
from posttrain.data.prepare import prepare_dataset
from posttrain.envs.tasks import TASKS
from posttrain.eval.evaluate import evaluate
from posttrain.models.io import load_tokenizer
from posttrain.models.tokenizer import tokenizer_training_texts, train_tokenizer
from posttrain.rl.controller import Controller
from posttrain.rl.remote import LocalActor
from posttrain.rl.roles import composed, registry
from posttrain.rl.types import ModelPut
from posttrain.sft import run_sft


class _Quiet:
    def log(self, m) -> None:
        pass

    def close(self, model_id=None, failed=False) -> None:
        pass


def _eval(model_dir: Path, ds: Path, cfg, reward, device: str) -> dict:
    r = evaluate(model_dir, ds, cfg, reward, device=device)
    return {"greedy": r.greedy_accuracy, "sampled": r.sampled_accuracy, "pass_at_k": r.pass_at_k}


def _groups(settings: registry.RunSettings, work: Path) -> tuple[dict, dict]:
    """(role -> group, role -> its worker objects): every role the run's settings enable, built as `rl.run`
    builds them (the registry's worker arguments and group constructors, then the roles the policy serves and
    the episode rollout), each worker a plain object in this process behind `LocalActor`."""
    built, ids, objs = {}, {}, {}
    for name, spec in registry.active_roles(settings).items():
        n = spec.workers(settings)
        objs[name] = [spec.worker()(**spec.worker_kwargs(settings, rank, n)) for rank in range(n)]
        built[name], ids[name] = [LocalActor(w) for w in objs[name]], [w.identity() for w in objs[name]]
    ctx = registry.GroupContext(settings=settings, ids=ids, timeout_s=settings.rl.remote_timeout_s,
                                weights_folder=str(work / "weights"))
    groups = composed.run_groups(ctx, built, settings.model.max_seq_len)
    return groups, objs


def _resolve(recipe: str, seed: int, overrides: dict | None, algorithm: str | None = None):
    over = {"data": {"seed": seed}, "model": {"init_seed": seed}, "sft": {"seed": seed}, "rl": {"seed": seed}}
    for section, fields in (overrides or {}).items():
        over[section] = {**over.get(section, {}), **fields}
    if algorithm:
        over["rl"] = {**over["rl"], "algorithm": algorithm}
    return recipes.resolve(recipe, over, workflow="agent_pipeline")


def run_seed(recipe: str, seed: int, device: str, rl_steps: int | None, work: Path, sft_steps: int | None = None,
             overrides: dict | None = None, algorithms: list[str | None] = (None,), on_row=None) -> list[dict]:
    """One row per algorithm (None: the recipe's), each RL run from the same SFT model of this seed; `on_row`
    is called with each as it is done."""
    cuda = device == "cuda"
    R = _resolve(recipe, seed, overrides)
    model = replace(R.model, dtype=DType.BF16 if cuda else R.model.dtype)
    t0 = time.perf_counter()
    prepare_dataset(R.data, work / "ds", tasks=TASKS)
    train_tokenizer(tokenizer_training_texts(work / "ds"), R.data.tokenizer.vocab_size, work / "tok",
                    split_words=R.data.tokenizer.split_words)
    run_sft(model_cfg=model, sft_cfg=replace(R.sft, steps=sft_steps or R.sft.steps, nproc=1, backend=Backend.AUTO, save_every=0),
            tracking_cfg=TrackingConfig(wandb=False, log_every=500), dataset_dir=work / "ds",
            tokenizer_dir=work / "tok", base_model_dir=None, out_dir=work / "sft", state_dir=work / "sft-state")
    sft_s = time.perf_counter() - t0
    sft = _eval(work / "sft", work / "ds", R.eval, R.reward, device)
    rows, first_model = [], None
    for a in algorithms:
        over = overrides
        if a == "on_policy_distill":  # its teacher: the first algorithm's RL model of this seed
            if first_model is None:
                raise SystemExit("--algorithms: on_policy_distill needs an algorithm before it, whose RL model "
                                 "is its teacher")
            over = {**(overrides or {}), "rl": {**(overrides or {}).get("rl", {}), "teacher": str(first_model)}}
        row, rl_dir = _rl_row(_resolve(recipe, seed, over, a), seed, model, rl_steps, work / f"rl-{a or 'recipe'}",
                              work, sft, sft_s, device)
        first_model = first_model or rl_dir
        rows.append(row)
        if on_row:
            on_row(rows[-1])
    return rows


def _rl_row(R, seed: int, model, rl_steps: int | None, work: Path, sft_work: Path, sft: dict, sft_s: float,
            device: str) -> tuple[dict, Path]:
    out, times = {"seed": seed, "sft": sft}, {"sft_s": sft_s}
    rl = replace(R.rl, steps=rl_steps or R.rl.steps, checkpoint_every=0)
    t0 = time.perf_counter()
    md = str(sft_work / "sft")
    one = {f: 1 for f in ("policy_workers", "reference_workers", "reward_workers", "teacher_workers")}
    placement = replace(R.placement, **one, rollout_workers=min(R.placement.rollout_workers, 1), critic_workers=0)
    settings = registry.RunSettings(rl=rl, reward=R.reward, placement=placement, model=model, start_model_dir=md)
    groups, workers = _groups(settings, work)  # one rank per SPMD role: one process holds one process group
    policy = workers["policy"][0]
    sampler = composed.prompt_sampler(read_examples(sft_work / "ds", "train"), load_tokenizer(md), rl,
                                      groups["rollout"], model.max_seq_len)
    history = Controller(rl, groups, sampler, _Quiet(), checkpointer=None).run(rl.steps)
    store = ArtifactStore(work / "store")
    ref_id = policy.save_model(ModelPut(store_root=str(store.root), name="rl", run_id=f"seed{seed}", parents=[],
                                        config={}, metrics={}, extra={}, provenance={"seed": seed}))
    for w in workers["environment"]:
        w.process.shutdown()
    times["rl_s"] = time.perf_counter() - t0
    rl_dir = store.get(ref_id)
    out["algorithm"] = rl.algorithm.value
    out["train_accuracy"] = [round(m.accuracy, 3) for m in history]
    out["rl"] = _eval(rl_dir, sft_work / "ds", R.eval, R.reward, device)
    alone = replace(R.eval, environment="", tools=[], episode=EpisodeConfig())
    out["rl_without_environment"] = _eval(rl_dir, sft_work / "ds", alone, R.reward, device)["greedy"]
    out["times"] = {k: round(v, 1) for k, v in times.items()}
    if rl.teacher:
        out["teacher"] = "the first algorithm's RL model"
    return out, rl_dir


def methods_table(rows: list[dict]) -> list[str]:
    """One line per algorithm run: SFT and RL accuracy in the environment, training accuracy first and last
    step, the RL model without the environment, RL wall."""
    out = [("| algorithm | SFT greedy / sampled | RL greedy / sampled | train accuracy, first -> last step | RL greedy "
           "without the environment | RL wall |"), "|---|---|---|---|---|---|"]
    for r in rows:
        s, q, acc = r["sft"], r["rl"], r["train_accuracy"]
        out.append(f"| {r['algorithm']} | {s['greedy']:.3f} / {s['sampled'] or 0:.3f} | {q['greedy']:.3f} / "
                   f"{q['sampled'] or 0:.3f} | {acc[0]:.3f} -> {acc[-1]:.3f} | {r['rl_without_environment']:.3f} | "
                   f"{r['times']['rl_s'] / 60:.1f} min |")
    return out


def _emit(row: dict, out: str) -> None:
    print("ROW", json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="tiny_calculator")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rl-steps", type=int, default=None, help="rl.steps (default: the recipe's)")
    ap.add_argument("--sft-steps", type=int, default=None, help="sft.steps (default: the recipe's)")
    ap.add_argument("--overrides", default="{}", help="JSON merged into every seed's, e.g. "
                    "'{\"rl\": {\"algorithm\": \"ppo\"}}'")
    ap.add_argument("--algorithms", nargs="+", default=[None], help="rl.algorithm of each RL run, every one "
                    "from the seed's same SFT model (default: the recipe's); on_policy_distill's teacher is the "
                    "first one's RL model")
    ap.add_argument("--out", default="", help="also write the rows as JSON lines here")
    ap.add_argument("--rows-from", nargs="+", default=[], help="no new run: the JSON rows of these kept outputs")
    ap.add_argument("--write-docs", action="store_true", help="write the methods table into docs/agents.md")
    args = ap.parse_args()
    if args.rows_from:
        rows = [json.loads(line) for f in args.rows_from for line in Path(f).read_text().splitlines()
                if line.startswith("{")]
        if not rows:
            sys.exit(f"--rows-from: no JSON rows in {args.rows_from}")
        lines = methods_table(rows)
        print("\n".join(lines))
        if args.write_docs:
            from default_seeds import write_block

            files = " ".join(str(Path(f)) for f in args.rows_from)
            block = "\n".join([*lines, "", (f"Command: `.venv/bin/python bench/agent_inprocess.py --rows-from {files} "
                                "--write-docs` (the kept runs' rows; each file's first lines name the run that made it).")])
            print(f"wrote the table into {write_block(block, '<!-- agent_methods:begin -->', '<!-- agent_methods:end -->')}")
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here")
    rows = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix=f"agent-inprocess-{seed}-") as tmp:
            rows += run_seed(args.recipe, seed, args.device, args.rl_steps, Path(tmp), args.sft_steps,
                             json.loads(args.overrides), args.algorithms, on_row=lambda row: _emit(row, args.out))
    print(f"\n{args.recipe} in-process on {args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU'}"
          f", torch {torch.__version__}), overrides {args.overrides}, sft.steps {args.sft_steps or 'recipe'}, rl.steps {args.rl_steps or 'recipe'}")
    print("| seed | algorithm | SFT greedy / sampled | RL greedy / sampled | RL without the environment | SFT s | RL s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        s, q = r["sft"], r["rl"]
        print(f"| {r['seed']} | {r['algorithm']} | {s['greedy']:.3f} / {s['sampled'] or 0:.3f} | {q['greedy']:.3f} / "
              f"{q['sampled'] or 0:.3f} | {r['rl_without_environment']:.3f} | {r['times']['sft_s']} | {r['times']['rl_s']} |")


if __name__ == "__main__":
    main()
