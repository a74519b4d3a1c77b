"""The project's GRPO against TRL's GRPOTrainer on identical work (the `trl` section of bench/rl.py).

1. Start checkpoint: the tiny_cpu recipe's own SFT model, made as `make run` makes it (stages.data_prep, then
   stages.sft on `sft.nproc` gloo ranks started with torch.distributed.run), in an artifact store under the
   bench cache (~/.cache/posttrain/bench/rl-trl or $POSTTRAIN_BENCH_CACHE): the stages' own cache keys (config,
   inputs, library source) let a rerun skip it.
2. Project: `run_rl` with the recipe's RL config (only checkpoint_every=0), model and placement, from that
   folder. Loop wall time = the sum of the steps' wall times (Ray start and actor start-up left out);
   generated tokens = the sum over steps of the rollouts' own tokens (up to and including EOS).
3. TRL: installed by this script with `pip install --target <cache>/trl-1.16.0 --no-deps` (trl, accelerate,
   psutil - its other requirements are in .venv), run as `.venv/bin/python bench/rl_trl.py` with that folder
   first on PYTHONPATH, on the same prompts in the same order (JSON in, JSON out; settings mapped there).
4. Both final models and the start model are scored by the project's own evaluation (stages.evaluate: the
   recipe's eval settings, greedy and k sampled, on the same held-out split).

With `lora` (bench/rl.py --trl-lora) both train LoRA adapters instead of every weight: the project with
`model.lora` (LORA below) at the grpo_lora settings of bench/algorithms.py (lr 1e-3, no warm-up), TRL with the
same peft LoraConfig (rank, alpha, dropout, target modules) on a PeftModel and an optimizer over its adapters
only; both take KL (if any) against the base with adapters off, and TRL's model is merged before it is scored.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRL_PINS = ("trl==1.16.0", "accelerate==1.15.0", "psutil==7.2.2")
"""Checked to install with --no-deps next to .venv: trl 1.16.0's other requirements (datasets, transformers,
huggingface_hub, numpy, pandas, pyarrow, packaging, jinja2) are already there; accelerate needs psutil."""


def cache_dir() -> Path:
    return Path(os.environ.get("POSTTRAIN_BENCH_CACHE") or "~/.cache/posttrain/bench/rl-trl").expanduser()


def start_checkpoint(recipe, store):
    """(SFT model ref, dataset ref): cached by the stages, else SFT runs on sft.nproc ranks in a subprocess."""
    from posttrain import stages
    from posttrain.config import TrackingConfig

    d = stages.data_prep(recipe.data, require_completions=True, run_id="bench-rl-trl", store=store)
    if store.cache_get(stages.sft_cache_key(store, recipe.model, recipe.sft, d.dataset, d.tokenizer, None)) is None:
        print(f"start checkpoint: SFT {recipe.sft.steps} steps on {recipe.sft.nproc} ranks (cached afterwards)", flush=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={recipe.sft.nproc}",
               __file__, "--sft", str(store.root)]
        subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    ref = stages.sft(recipe.model, recipe.sft, TrackingConfig(wandb=False), dataset=d.dataset,
                     tokenizer=d.tokenizer, run_id="bench-rl-trl", store=store)
    return ref, d.dataset


def _sft_rank(store_root: str) -> None:
    """One SFT rank (under torch.distributed.run): what tasks/sft.py runs on each Elastic rank."""
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.config import TrackingConfig
    from posttrain.recipes import tiny_cpu

    recipe, store = tiny_cpu(), ArtifactStore(store_root)
    d = stages.data_prep(recipe.data, require_completions=True, run_id="bench-rl-trl", store=store)
    stages.sft(recipe.model, recipe.sft, TrackingConfig(wandb=False), dataset=d.dataset,
               tokenizer=d.tokenizer, run_id="bench-rl-trl", store=store)


def install_trl() -> Path:
    target = cache_dir() / ("trl-" + "-".join(p.split("==")[1] for p in TRL_PINS))
    if not (target / ".complete").exists():
        print(f"installing {' '.join(TRL_PINS)} into {target}", flush=True)
        subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--upgrade",
                        "--target", str(target), *TRL_PINS], check=True)
        (target / ".complete").touch()
    return target


LORA = {"rank": 16, "alpha": 32.0, "dropout": 0.0}
"""The adapters of both sides with --trl-lora (target modules: LoraConfig's default, attention and MLP)."""
LORA_RL = {"lr": 1e-3, "warmup_steps": 0}
"""The RL settings that change with LoRA (bench/algorithms.py's grpo_lora)."""


def run_project(recipe, rl_cfg, store, model_ref, ds_ref) -> dict:
    from posttrain.config import TrackingConfig
    from posttrain.rl.run import run_rl

    with tempfile.TemporaryDirectory(prefix="bench-rl-trl-state-") as state:
        t0 = time.perf_counter()
        res = run_rl(rl_cfg=rl_cfg, reward_cfg=recipe.reward, model_cfg=recipe.model, placement_cfg=recipe.placement,
                     max_seq_len=recipe.model.max_seq_len, tracking_cfg=TrackingConfig(wandb=False,
                                                                                         log_every=25),
                     start_model_dir=store.get(model_ref), dataset_dir=store.get(ds_ref), store_root=str(store.root),
                     run_id=f"bench-project-{int(time.time())}", parents=[model_ref.id, ds_ref.id], state_dir=state,
                     start_model_id=model_ref.id)
        total = time.perf_counter() - t0
    steps = [h.step_s for h in res.history]
    return {"model": res.model, "wall_s": sum(steps), "total_s": total, "step_s": steps,
            "tokens": sum(h.generated_tokens for h in res.history), "reward_mean": [h.reward_mean for h in res.history],
            "history": res.history}


def trl_prompts(recipe, rl_cfg, model_dir: Path, ds_dir: Path) -> list[dict]:
    """The project's prompts in the order its PromptSampler hands them out, step by step."""
    from posttrain.data.examples import read_examples
    from posttrain.models.io import load_tokenizer
    from posttrain.rl.state import PromptSampler

    tok = load_tokenizer(model_dir)
    sampler = PromptSampler(read_examples(ds_dir, "train"), tok, prompts_per_step=rl_cfg.prompts_per_step,
                            seed=rl_cfg.seed, max_prompt_len=recipe.model.max_seq_len - rl_cfg.max_new_tokens)
    out = []
    for _ in range(rl_cfg.steps):
        b = sampler.next_batch(policy_version=0)
        for ids, msgs, answer, task in zip(b.prompt_ids, b.messages, b.answers, b.tasks):
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            out.append({"text": text, "ids": ids, "answer": answer, "task": task})
    return out


def run_trl_script(script: str, spec: dict, tmp: Path) -> tuple[dict, float]:
    """Run bench/`script` (a TRL side: IN.json -> OUT.json) in the throwaway TRL environment; returns its output
    and the process's wall seconds end to end (imports, model load, trainer set-up, train, save)."""
    (tmp / "in.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(install_trl()), "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}  # no hub here; TRL pings telemetry otherwise
    t0 = time.perf_counter()
    subprocess.run([str(ROOT / ".venv/bin/python"), str(ROOT / "bench" / script), str(tmp / "in.json"),
                    str(tmp / "out.json")], cwd=ROOT, env=env, check=True)
    return json.loads((tmp / "out.json").read_text()), time.perf_counter() - t0


def run_trl(recipe, rl_cfg, store, model_ref, ds_ref, threads: int) -> dict:
    from posttrain.config import to_dict

    model_dir = store.get(model_ref)
    with tempfile.TemporaryDirectory(prefix="bench-rl-trl-") as tmp:
        spec = {"model_dir": str(model_dir), "out_dir": tmp, "threads": threads, "seed": rl_cfg.seed,
                "rl": to_dict(rl_cfg), "prompts": trl_prompts(recipe, rl_cfg, model_dir, store.get(ds_ref)),
                "lora": to_dict(recipe.model.lora) if recipe.model.lora else None}
        out, total = run_trl_script("rl_trl.py", spec, Path(tmp))
        ref = store.put("model", "trl-grpo", Path(tmp) / "model", run_id="bench-rl-trl",
                        parents=[model_ref.id, ds_ref.id], config={"rl": to_dict(rl_cfg), "trainer": "trl"})
    return {"model": ref, "wall_s": out["wall_s"], "total_s": total, "step_s": out["step_s"],
            "tokens": out["generated_tokens"], "reward_mean": out["reward_mean"], "versions": out["versions"],
            "torch_threads": out["torch_threads"]}


def compare(steps: int | None = None, threads: int = 2, lora: bool = False, pairs: int = 1,
            project: dict | None = None) -> dict:
    """Both runs and their evaluations, `pairs` times in turn (the models of the first pair evaluated); returns the
    rows bench/rl.py prints. `project`: {"rl": {...}, "placement": {...}} for the project's side only (its fastest
    setting, e.g. rl.max_staleness); the work - prompts, samples, lengths, lr - stays the recipe's on both."""
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.config import LoraConfig
    from posttrain.recipes import tiny_cpu

    recipe = tiny_cpu()
    store = ArtifactStore(cache_dir() / "store")
    model_ref, ds_ref = start_checkpoint(recipe, store)  # the recipe's SFT model (fully trained) on both sides
    rl_cfg = replace(recipe.rl, checkpoint_every=0, **({"steps": steps} if steps else {}), **(LORA_RL if lora else {}))
    if lora:
        recipe = replace(recipe, model=replace(recipe.model, lora=LoraConfig(**LORA)))

    def acc(ref):
        e = stages.evaluate(recipe.eval, recipe.reward, model=ref, dataset=ds_ref, run_id="bench-rl-trl", store=store)
        return e.greedy_accuracy, e.sampled_accuracy

    project = project or {}
    own = replace(recipe, placement=replace(recipe.placement, **project.get("placement", {})))
    own_rl = replace(rl_cfg, **project.get("rl", {}))
    start = acc(model_ref)
    all_rows = []
    for pair in range(pairs):
        rows = {}
        for name, run in (("posttrain GRPO", lambda: run_project(own, own_rl, store, model_ref, ds_ref)),
                          ("TRL GRPOTrainer", lambda: run_trl(recipe, rl_cfg, store, model_ref, ds_ref, threads))):
            print(f"\n== pair {pair + 1}/{pairs}, {name}: {rl_cfg.steps} steps ==", flush=True)
            r = run()
            if pair == 0:
                r["after"] = acc(r["model"])
            r["tok_s"] = r["tokens"] / r["wall_s"]
            r["median_step_s"] = statistics.median(r["step_s"])
            rows[name] = r
        all_rows.append(rows)
    return {"recipe": recipe, "rl": rl_cfg, "start": start, "rows": all_rows[0], "pairs": all_rows,
            "lora": recipe.model.lora, "project": project}


if __name__ == "__main__" and sys.argv[1:2] == ["--sft"]:
    _sft_rank(sys.argv[2])
