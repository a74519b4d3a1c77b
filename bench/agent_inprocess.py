"""agent_pipeline's stages in ONE process, for a machine without Flyte or Ray (the lent GPU machine's image has
neither): data prep -> SFT -> evaluation in the environment -> RL in the environment -> evaluation in the
environment, per seed, with the real role workers driven by the real `Controller` through `LocalActor` (as
tests/gpu/test_cuda_rl.py does). The same recipe, seeds and stages as `bench/default_seeds.py --workflow
agent_pipeline`; what differs is the orchestration (no Flyte cache, no Ray actors) and, on a GPU, the
precision (bf16 rollouts and reference, fp32 policy with bf16 autocast).

    python bench/agent_inprocess.py --recipe tiny_guess_number --seeds 0 1 2 [--device cuda] [--rl-steps 60]

Prints one line per seed (SFT and RL held-out greedy / sampled accuracy in the environment, the RL model
without it, seconds per stage) and a table at the end. CPU: expect the pipeline's own time (~10-15 min a seed).
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
from posttrain.rl.roles.environment import EnvironmentGroup, EnvironmentWorker
from posttrain.rl.roles.policy import PolicyWorker
from posttrain.rl.roles.policy_group import PolicyGroup
from posttrain.rl.roles.reference import ReferenceGroup, ReferenceWorker
from posttrain.rl.roles.reward import RewardGroup, RewardWorker
from posttrain.rl.roles.rollout import RolloutGroup, RolloutWorker
from posttrain.rl.state import PromptSampler
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


def run_seed(recipe: str, seed: int, device: str, rl_steps: int | None, work: Path, sft_steps: int | None = None
             ) -> dict:
    cuda = device == "cuda"
    R = recipes.resolve(recipe, {"data": {"seed": seed}, "model": {"init_seed": seed}, "sft": {"seed": seed},
                                 "rl": {"seed": seed}}, workflow="agent_pipeline")
    model = replace(R.model, dtype=DType.BF16 if cuda else R.model.dtype)
    rl = replace(R.rl, steps=rl_steps or R.rl.steps, checkpoint_every=0)
    out, times = {"seed": seed}, {}
    t0 = time.perf_counter()
    prepare_dataset(R.data, work / "ds", tasks=TASKS)
    train_tokenizer(tokenizer_training_texts(work / "ds"), R.data.tokenizer.vocab_size, work / "tok",
                    split_words=R.data.tokenizer.split_words)
    run_sft(model_cfg=model, sft_cfg=replace(R.sft, steps=sft_steps or R.sft.steps, nproc=1, backend=Backend.AUTO, save_every=0),
            tracking_cfg=TrackingConfig(wandb=False, log_every=500), dataset_dir=work / "ds",
            tokenizer_dir=work / "tok", base_model_dir=None, out_dir=work / "sft", state_dir=work / "sft-state")
    times["sft_s"] = time.perf_counter() - t0
    out["sft"] = _eval(work / "sft", work / "ds", R.eval, R.reward, device)

    t0 = time.perf_counter()
    md, t = str(work / "sft"), rl.remote_timeout_s
    rollout = RolloutWorker(md, 0, 1, model_cfg=model)
    policy = PolicyWorker(md, rl, 0, 1, model_cfg=model)
    envs = [EnvironmentWorker(rl.environment, list(rl.tools), rl.episode, rank, 2) for rank in range(2)]
    pg = PolicyGroup([LocalActor(policy)], [policy.identity()], t, rl.micro_batch_size)
    pg.setup()
    groups = {"rollout": RolloutGroup([LocalActor(rollout)], [rollout.identity()], t),
              "environment": EnvironmentGroup([LocalActor(w) for w in envs], [w.identity() for w in envs], t,
                                              source=rl.environment),
              "reward": RewardGroup([LocalActor(RewardWorker(R.reward, 0, 1))], [("reward", 0)], t,
                                    weight=R.reward.fn_weight),
              "policy": pg}
    if registry.uses_reference(rl):
        reference = ReferenceWorker(md, 0, 1, cfg=rl, model_cfg=model)
        groups["reference"] = ReferenceGroup([LocalActor(reference)], [reference.identity()], t)
    settings = registry.RunSettings(rl=rl, reward=R.reward, placement=R.placement, model=model, start_model_dir=md)
    groups.update(composed.episode_rollout(settings, groups, max_seq_len=model.max_seq_len))
    sampler = PromptSampler(read_examples(work / "ds", "train"), load_tokenizer(md),
                            prompts_per_step=rl.prompts_per_step, seed=rl.seed, episode_ids=groups["rollout"].prompt_ids,
                            max_prompt_len=model.max_seq_len - rl.episode.max_total_tokens)
    history = Controller(rl, groups, sampler, _Quiet(), checkpointer=None).run(rl.steps)
    store = ArtifactStore(work / "store")
    ref_id = policy.save_model(ModelPut(store_root=str(store.root), name="rl", run_id=f"seed{seed}", parents=[],
                                        config={}, metrics={}, extra={}, provenance={"seed": seed}))
    for w in envs:
        w.process.shutdown()
    times["rl_s"] = time.perf_counter() - t0
    rl_dir = store.get(ref_id)
    out["train_accuracy"] = [round(m.accuracy, 3) for m in history]
    out["rl"] = _eval(rl_dir, work / "ds", R.eval, R.reward, device)
    alone = replace(R.eval, environment="", tools=[], episode=EpisodeConfig())
    out["rl_without_environment"] = _eval(rl_dir, work / "ds", alone, R.reward, device)["greedy"]
    out["times"] = {k: round(v, 1) for k, v in times.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="tiny_calculator")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rl-steps", type=int, default=None, help="rl.steps (default: the recipe's)")
    ap.add_argument("--sft-steps", type=int, default=None, help="sft.steps (default: the recipe's)")
    ap.add_argument("--out", default="", help="also write the rows as JSON lines here")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here")
    rows = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix=f"agent-inprocess-{seed}-") as tmp:
            row = run_seed(args.recipe, seed, args.device, args.rl_steps, Path(tmp), args.sft_steps)
        rows.append(row)
        print("ROW", json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    print(f"\n{args.recipe} in-process on {args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU'}"
          f", torch {torch.__version__}), sft.steps {args.sft_steps or 'recipe'}, rl.steps {args.rl_steps or 'recipe'}")
    print("| seed | SFT greedy / sampled | RL greedy / sampled | RL without the environment | SFT s | RL s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        s, q = r["sft"], r["rl"]
        print(f"| {r['seed']} | {s['greedy']:.3f} / {s['sampled'] or 0:.3f} | {q['greedy']:.3f} / {q['sampled'] or 0:.3f}"
              f" | {r['rl_without_environment']:.3f} | {r['times']['sft_s']} | {r['times']['rl_s']} |")


if __name__ == "__main__":
    main()
