"""The project's agentic GRPO against TRL's GRPOTrainer with the same tool, on the calculator task from the same
SFT model (issue 45, item 7): held-out accuracy in the environment and generated tokens/s side by side.

    .venv/bin/python bench/agent_vs_trl.py                 # tiny_calculator, seed 0, the recipe's 100 RL steps
    .venv/bin/python bench/agent_vs_trl.py --steps 30 --seed 3

1. Start checkpoint: the recipe's own SFT model on its calculator demonstrations, made as agent_pipeline makes
   it (stages.data_prep, then stages.sft on `sft.nproc` gloo ranks under torch.distributed.run), in a store under
   the bench cache (~/.cache/posttrain/bench/rl-trl/agent-store-<recipe>-<seed>): a rerun reuses it.
2. Project: `run_rl` with the recipe's RL settings (the Calculator environment, rl.episode's limits) on a local
   Ray, as the `rl` task runs. Loop wall = the sum of the steps' walls (Ray and actor start-up left out);
   generated tokens = the tokens the policy sampled (the environment's answers left out).
3. TRL 1.16.0 (installed into the throwaway folder bench/rl_vs_trl.py uses) runs bench/agent_trl.py in a
   subprocess: GRPOTrainer with `tools=[Calculator().calculate]`, the same prompts in the same order, the same
   GRPO settings; generated tokens = TRL's tool mask summed (tool results left out). How both see the same
   tokens and what differs: bench/agent_trl.py's docstring.
4. The start model and both RL models are scored by the project's evaluation in the environment (the recipe's
   eval: greedy and k sampled episodes per held-out problem, the same split), and greedy without the tool.

Prints a markdown table; with --out, also the rows as JSON; --write-docs puts the table in docs/agents.md.
`--table-from bench/results/agent-vs-trl-2026-11-29.json --write-docs` remakes the docs' table from a kept run
without running. One run at a time (two on 2 cores are noise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ siblings
from default_seeds import _commit
from rl_vs_trl import cache_dir, run_trl_script

ROOT = Path(__file__).resolve().parents[1]


def seeded(recipe_name: str, seed: int):
    from posttrain import recipes

    return recipes.resolve(recipe_name, {"data": {"seed": seed}, "model": {"init_seed": seed}, "sft": {"seed": seed},
                                         "rl": {"seed": seed}}, workflow="agent_pipeline")


def store_for(recipe_name: str, seed: int):
    from posttrain.artifacts import ArtifactStore

    return ArtifactStore(cache_dir() / f"agent-store-{recipe_name}-{seed}")


def start_checkpoint(recipe_name: str, seed: int):
    """(SFT model ref, dataset ref): cached by the stages, else SFT runs on sft.nproc ranks in a subprocess."""
    from posttrain import stages
    from posttrain.config import TrackingConfig

    recipe, store = seeded(recipe_name, seed), store_for(recipe_name, seed)
    d = stages.data_prep(recipe.data, require_completions=True, run_id="bench-agent-trl", store=store)
    if store.cache_get(stages.sft_cache_key(store, recipe.model, recipe.sft, d.dataset, d.tokenizer, None)) is None:
        print(f"start checkpoint: SFT {recipe.sft.steps} steps on {recipe.sft.nproc} ranks (cached afterwards)", flush=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={recipe.sft.nproc}",
               __file__, "--sft-rank", recipe_name, str(seed)]
        subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    ref = stages.sft(recipe.model, recipe.sft, TrackingConfig(wandb=False), dataset=d.dataset,
                     tokenizer=d.tokenizer, run_id="bench-agent-trl", store=store)
    return ref, d.dataset


def _sft_rank(recipe_name: str, seed: int) -> None:
    """One SFT rank (under torch.distributed.run): what tasks/sft.py runs on each Elastic rank."""
    from posttrain import stages
    from posttrain.config import TrackingConfig

    recipe, store = seeded(recipe_name, seed), store_for(recipe_name, seed)
    d = stages.data_prep(recipe.data, require_completions=True, run_id="bench-agent-trl", store=store)
    stages.sft(recipe.model, recipe.sft, TrackingConfig(wandb=False), dataset=d.dataset, tokenizer=d.tokenizer,
               run_id="bench-agent-trl", store=store)


def episode_prompts(recipe, rl_cfg, model_dir: Path, ds_dir: Path) -> list[dict]:
    """The project's episode prompts in the order its PromptSampler hands them out, step by step: the row's turns
    without the tools' system turn (TRL's template renders it from `tools=`) and the project's ids."""
    from posttrain.data.examples import episode_prompt, read_examples
    from posttrain.envs.builtin import Calculator
    from posttrain.envs.calls import tools_block
    from posttrain.envs.plan import checked_layout
    from posttrain.envs.tools import environment_tools
    from posttrain.models.io import load_tokenizer
    from posttrain.rl.state import PromptSampler

    if rl_cfg.environment != "posttrain.envs.builtin:Calculator" or rl_cfg.tools:
        raise SystemExit(f"this bench gives TRL the Calculator's tool; the recipe's rl.environment is "
                         f"{rl_cfg.environment!r}, rl.tools {rl_cfg.tools}")
    layout, specs = checked_layout(str(model_dir)), environment_tools(Calculator)
    block = tools_block(specs)
    sampler = PromptSampler(read_examples(ds_dir, "train"), load_tokenizer(model_dir),
                            prompts_per_step=rl_cfg.prompts_per_step, seed=rl_cfg.seed,
                            max_prompt_len=recipe.model.max_seq_len - rl_cfg.episode.max_total_tokens,
                            prompt_of=episode_prompt, encode=lambda messages: layout.prompt_ids(messages, specs, None),
                            room_setting="rl.episode.max_total_tokens")
    out = []
    for _ in range(rl_cfg.steps):
        b = sampler.next_batch(policy_version=0)
        for ids, msgs, answer, task in zip(b.prompt_ids, b.messages, b.answers, b.tasks):
            turns = [m for m in msgs if not (m["role"] == "system" and m["content"] == block)]
            out.append({"messages": turns, "ids": ids, "answer": answer, "task": task})
    return out


def run_project(recipe, rl_cfg, store, model_ref, ds_ref) -> dict:
    from posttrain.config import TrackingConfig
    from posttrain.rl.run import run_rl

    with tempfile.TemporaryDirectory(prefix="bench-agent-trl-state-") as state:
        t0 = time.perf_counter()
        res = run_rl(rl_cfg=rl_cfg, reward_cfg=recipe.reward, model_cfg=recipe.model, placement_cfg=recipe.placement,
                     max_seq_len=recipe.model.max_seq_len, tracking_cfg=TrackingConfig(wandb=False, log_every=10),
                     start_model_dir=store.get(model_ref), dataset_dir=store.get(ds_ref), store_root=str(store.root),
                     run_id=f"bench-agent-project-{int(time.time())}", parents=[model_ref.id, ds_ref.id],
                     state_dir=state, start_model_id=model_ref.id)
        total = time.perf_counter() - t0
    h = res.history
    return {"model": res.model, "wall_s": sum(m.step_s for m in h), "total_s": total, "step_s": [m.step_s for m in h],
            "tokens": sum(m.generated_tokens for m in h), "reward_mean": [m.reward_mean for m in h],
            "tool_calls": sum(m.extra.get("env/tool_calls_mean", 0.0) * m.num_samples for m in h),
            "tool_failures": sum(m.extra.get("env/tool_errors", 0.0) for m in h)}


def run_trl(recipe, rl_cfg, store, model_ref, ds_ref, threads: int) -> dict:
    from posttrain.config import to_dict

    model_dir = store.get(model_ref)
    with tempfile.TemporaryDirectory(prefix="bench-agent-trl-") as tmp:
        spec = {"model_dir": str(model_dir), "out_dir": tmp, "threads": threads, "seed": rl_cfg.seed,
                "rl": to_dict(rl_cfg), "prompts": episode_prompts(recipe, rl_cfg, model_dir, store.get(ds_ref))}
        out, total = run_trl_script("agent_trl.py", spec, Path(tmp))
        ref = store.put("model", "trl-grpo-tools", Path(tmp) / "model", run_id="bench-agent-trl",
                        parents=[model_ref.id, ds_ref.id], config={"rl": to_dict(rl_cfg), "trainer": "trl"})
    return {"model": ref, "wall_s": out["wall_s"], "total_s": total, "step_s": out["step_s"],
            "tokens": out["generated_tokens"], "reward_mean": out["reward_mean"], "tool_calls": out["tool_calls"],
            "tool_failures": out["tool_failures"], "versions": out["versions"], "suffix": out["tool_result_suffix"]}


def compare(recipe_name: str, seed: int, steps: int | None, threads: int) -> dict:
    from posttrain import stages
    from posttrain.config import EpisodeConfig

    recipe = seeded(recipe_name, seed)
    store = store_for(recipe_name, seed)
    model_ref, ds_ref = start_checkpoint(recipe_name, seed)
    rl_cfg = replace(recipe.rl, checkpoint_every=0, **({"steps": steps} if steps else {}))
    alone = replace(recipe.eval, environment="", tools=[], episode=EpisodeConfig(), k=0)

    def acc(ref) -> dict:
        e = stages.evaluate(recipe.eval, recipe.reward, model=ref, dataset=ds_ref, run_id="bench-agent-trl",
                            store=store)
        a = stages.evaluate(alone, recipe.reward, model=ref, dataset=ds_ref, run_id="bench-agent-trl", store=store)
        return {"greedy": e.greedy_accuracy, "sampled": e.sampled_accuracy, "alone": a.greedy_accuracy}

    start = acc(model_ref)
    print(f"start model {model_ref.short}: {start}", flush=True)
    rows = {}
    for name, run in (("posttrain GRPO", lambda: run_project(recipe, rl_cfg, store, model_ref, ds_ref)),
                      ("TRL GRPOTrainer", lambda: run_trl(recipe, rl_cfg, store, model_ref, ds_ref, threads))):
        print(f"\n== {name}: {rl_cfg.steps} steps ==", flush=True)
        r = run()
        r["after"] = acc(r["model"])
        r["tok_s"] = r["tokens"] / r["wall_s"]
        r["median_step_s"] = statistics.median(r["step_s"])
        print(f"{name}: {r['after']}, {r['tokens']} tokens in {r['wall_s']:.0f} s", flush=True)
        rows[name] = r
    return {"recipe": recipe, "rl": rl_cfg, "start": start, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="tiny_calculator")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0, help="RL steps (0: the recipe's)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the TRL process")
    ap.add_argument("--out", default="", help="also write the result as JSON here")
    ap.add_argument("--table-from", default="", metavar="JSON",
                    help="no run: the table of a kept --out file (bench/results/agent-vs-trl-*.json)")
    ap.add_argument("--write-docs", action="store_true", help="replace docs/agents.md's agent_vs_trl table")
    args = ap.parse_args()
    if args.table_from:
        kept = json.loads(Path(args.table_from).read_text())
        log = Path(args.table_from).with_suffix(".txt")
        block = table(kept["start"], kept["rows"], kept.get("made_by", (
            f"`.venv/bin/python bench/agent_vs_trl.py`, its rows kept in `{args.table_from}`"
            + (f" and its log (commit, machine, versions, load) in `{log}`" if log.exists() else ""))))
    else:
        res = compare(args.recipe, args.seed, args.steps or None, args.threads)
        rl, s, rows = res["rl"], res["start"], res["rows"]
        print(f"\n## {args.recipe} (seed {args.seed}): SFT model -> GRPO in the Calculator environment, {rl.steps} "
              f"steps x {rl.prompts_per_step} prompts x {rl.samples_per_prompt} episodes; held-out problems scored by "
              "the project's evaluation (greedy / sampled in the environment; greedy without the tool)\n")
        trl = rows["TRL GRPOTrainer"]
        made_by = (f"`.venv/bin/python bench/agent_vs_trl.py {' '.join(a for a in sys.argv[1:] if a != '--write-docs')}`"
                   f" (commit {_commit()}, {platform.processor() or platform.machine()}, load average "
                   f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end; TRL appends a tool result as "
                   f"{trl['suffix']!r}; versions {trl['versions']})")
        block = table(s, rows, made_by)
        if args.out:
            Path(args.out).write_text(json.dumps({"start": s, "made_by": made_by,
                                                  "rows": {n: {k: v for k, v in r.items() if k != "model"}
                                                           for n, r in rows.items()}}, default=str))
    print(block)
    if args.write_docs:
        from default_seeds import write_block

        print(f"wrote the table into {write_block(block, '<!-- agent_vs_trl:begin -->', '<!-- agent_vs_trl:end -->')}")


def table(start: dict, rows: dict, made_by: str) -> str:
    """The markdown table (and the ratio) of a comparison: the start model's row, then each trainer's."""
    out = [("| trainer | held-out greedy | sampled | greedy without the tool | generated tokens | loop wall | tokens/s "
            "| median step | tool calls | failed calls |"), "|---|---|---|---|---|---|---|---|---|---|",
           f"| SFT start | {start['greedy']:.3f} | {start['sampled']:.3f} | {start['alone']:.3f} | | | | | | |"]
    for name, r in rows.items():
        a = r["after"]
        out.append(f"| {name} | {a['greedy']:.3f} | {a['sampled']:.3f} | {a['alone']:.3f} | {r['tokens']:,} | "
                   f"{r['wall_s']:.0f} s | {r['tok_s']:,.0f} | {r['median_step_s']:.2f} s | {r['tool_calls']:,.0f} | "
                   f"{r['tool_failures']:.0f} |")
    ratio = rows["posttrain GRPO"]["tok_s"] / rows["TRL GRPOTrainer"]["tok_s"]
    out += ["", f"posttrain / TRL generated tokens/s: x{ratio:.2f}. Made by {made_by}."]
    return "\n".join(out)


if __name__ == "__main__" and sys.argv[1:2] == ["--sft-rank"]:
    _sft_rank(sys.argv[2], int(sys.argv[3]))
elif __name__ == "__main__":
    main()
