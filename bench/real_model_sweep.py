"""RL settings for a real model, tried fast: each config in its own process (no Ray, no Flyte), the greedy accuracy
on the validation split every few steps - to find a recipe in minutes (on a lent GPU) before bench/real_model.py
judges it on the test split through the pipeline on this machine.

    .venv/bin/python bench/real_model_sweep.py --out /tmp/sweep --prepare-only          # task + dataset, here
    .venv/bin/python bench/real_model_sweep.py --out /tmp/sweep --steps 60 --parallel 4 \\
        --configs '[{"name": "lr1e-4", "rl": {"lr": 1e-4}}, {"name": "T0.7", "rl": {"temperature": 0.7}}]'
    .venv/bin/python bench/real_model_sweep.py --out /tmp/sweep-spelling --family spelling --split train_first
    ... --validation-n 256 --test-n 256 --train 2000   # the split sizes (defaults): bench/real_model.py's
    ... --gguf FILE --tools DIR      # where no model folder exists: de-quantise the GGUF as `make real-model` does
    .venv/bin/python bench/real_model_sweep.py --out /tmp/sweep --table [--baseline recipe]   # the paired table

What it runs is the pipeline's RL in-process, as tests/gpu does: the real PolicyWorker (LoRA, generating its own
rollouts) and RewardWorker driven by the real Controller, from the recipe (`--recipe`, default
small_instruct_lora_cpu) with each config's overrides (`rl.*`, `model.lora`, ...). Data: bench/real_model.py's task
(bench/rg_task.py: `--family`, `--task`, `--train-task`, `--split` - held_out_first by default here - and the split
sizes), in three splits with no question in two; OUT/ds is prepared by posttrain.data.prepare with the validation
split as its evaluation set. Every config is scored on the validation split only: the test split (`--test-n`
questions) is built so that train and validation leave it out and is never read, so pass bench/real_model.py's
split options to score on its validation split and keep its test split unseen. Refused before anything runs: an
OUT/ds this sweep did not prepare on the validation split (made before the three splits or by another script:
`--out`), or prepared with other data options; `--eval-n` beyond `--validation-n`; a config that sets `data`
beyond `data.pass_rate`. A config with `{"data": {"pass_rate": {"enabled": true, ...}}}` trains on the train
prompts its start model's pass rate keeps, as the pipeline's select_prompts stage does (posttrain.eval.pass_rate,
sampled with the config's rl settings, measured in its own process before step 0; the counts are a JSON line;
measured once in OUT/selected/ for each selection_key - model, data.pass_rate, sampling settings, reward - so
configs that differ only in lr or KL share it).
The reward is the family's rule in plain Python, so it runs where reasoning-gym is not installed (the GPU
machine): arithmetic, reward `number`'s - the completion's last number equals the answer as a decimal, which is
what reasoning-gym's chain_sum scorer computes for it (`compute_decimal_reward`); spelling, reward `word`'s 1.0 -
the completion's last word is the answer, case ignored (reasoning-gym's spell_backward scorer would also give a
right prefix partial credit; this gives it 0). Evaluation: greedy on the first --eval-n validation problems (all of
them by default) with the policy's own model (adapters applied), the recipe's eval.max_new_tokens; correct when the
reward is 1.0.

Prints one JSON line per evaluation: config name, step, validation greedy accuracy, every problem's result in order
("right": a string of 1 and 0, so `--table` pairs two configs problem by problem), and the mean train accuracy,
entropy and response length over the steps since the last evaluation (each config's log in OUT/logs also has every
step). Every config appends the same lines to OUT/evaluations.jsonl as it goes: one file holds the whole sweep,
kept when a time limit stops it (a lent GPU's call returns a bounded number of files: on 2026-11-30 it returned
2 of 8 logs). Not a substitute for bench/real_model.py: no Flyte, no merged-model evaluation, and a GPU's float rounding is
not this CPU's. Its step-0 accuracy is the pipeline's on the same problems: 0.227 on the 256 validation problems
of the arithmetic family as validation was dealt until 2026-11-30 (first, before test: bench/rg_task.split_questions).

Measured before the three splits, on what was the validation split until 2026-11-30 (2026-11-26,
bench/results/real-model-sweep-gpu-2026-11-26.txt): on the lent H200 the GGUF was brought in
two calls (FACTS' recipe for large files) and de-quantised there to the same weights (fingerprint equal). 16 configs
at once (--parallel 16 --threads 1) ran ~22 s per step each - processes time-share one GPU, so run a few at a time -
and the call's limit stopped them at step 10: held-out greedy 0.227 -> 0.219..0.297 (mean 0.254), no config clearly
apart from the others at that point. On this CPU (--threads 2, real-model-sweep-cpu-2026-11-26.txt), T 0.7 with
kl_coef 0.05 and gradient checkpointing off, ~44 s a step: 0.227 -> 0.320 at step 50 and 0.281 at step 60.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from rg_task import Sizes, check_split, last_list, last_number, last_word, same_list, same_number, same_word
from sweep_data import check_prepared, fingerprint, options, prepare
from sweep_table import table


def number_score(completion: str, answer: str, metadata: dict) -> float:
    """1.0 when the completion's last number equals the answer as a decimal (reward `number` for chain_sum)."""
    return float(same_number(last_number(completion), answer))


def word_score(completion: str, answer: str, metadata: dict) -> float:
    """1.0 when the completion's last word is the answer, case ignored (reward `word`'s 1.0 for spell_backward;
    reasoning-gym's scorer would also give a right prefix partial credit, this gives it 0)."""
    return float(same_word(last_word(completion), answer))


def list_score(completion: str, answer: str, metadata: dict) -> float:
    """1.0 when the completion's last bracketed list is the answer's numbers in order (reward `list` for
    number_sorting; reasoning-gym's scorer also takes numbers within 1 of each, this does not)."""
    return float(same_list(last_list(completion), answer))


SCORES = {"arithmetic": number_score, "spelling": word_score, "sorting": list_score}
"""The sweep's reward and evaluation per `--family`, in plain Python (no reasoning-gym where it runs)."""


def _controller(spec: dict, args):
    """(config, policy worker, controller) for one config: the real PolicyWorker (LoRA, generating its own
    rollouts) and RewardWorker in this process, grouped as the registry groups them for the Controller."""
    import torch

    from posttrain.data.examples import read_examples
    from posttrain.models.io import load_tokenizer
    from posttrain.recipes import resolve
    from posttrain.rl.controller import Controller
    from posttrain.rl.remote import LocalActor
    from posttrain.rl.roles.composed import served_by_policy
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.roles.policy_group import PolicyGroup
    from posttrain.rl.roles.registry import RunSettings
    from posttrain.rl.roles.reward import RewardGroup, RewardWorker
    from posttrain.rl.state import PromptSampler

    class Keep:
        def log(self, m): pass
        def close(self, model_id=None, failed=False): pass

    over = {k: v for k, v in spec.items() if k != "name"}
    over["model"] = {**over.get("model", {}), "base_path": str(args.model)}
    over["reward"] = {"fn": f"real_model_sweep:{SCORES[args.family].__name__}", "python_path": [str(HERE)]}
    over["rl"] = {**over.get("rl", {}), "steps": args.steps, "checkpoint_every": 0}
    cfg = resolve(args.recipe, over)
    rl, md = cfg.rl, str(args.model)
    data_dir = _selected(cfg, args, spec.get("name", "config")) if cfg.data.pass_rate.enabled else args.out / "ds"
    policy = PolicyWorker(md, rl, 0, 1, model_cfg=cfg.model, threads=args.threads)
    reward = RewardWorker(cfg.reward, 0, 1)
    torch.set_num_threads(args.threads)  # each worker sets the process's torch threads; the reward's 1 came last
    t = rl.remote_timeout_s
    pg = PolicyGroup([LocalActor(policy)], [policy.identity()], t, rl.micro_batch_size, mini_batches=rl.mini_batches,
                     seed=rl.seed, generates=True)  # as registry's policy group arguments
    pg.setup()
    groups = {"reward": RewardGroup([LocalActor(reward)], [reward.identity()], t), "policy": pg}
    settings = RunSettings(rl=rl, reward=cfg.reward, placement=cfg.placement, model=cfg.model, start_model_dir=md)
    groups.update(served_by_policy(settings, groups))
    sampler = PromptSampler(read_examples(data_dir, "train"), load_tokenizer(md),
                            prompts_per_step=rl.prompts_per_step, seed=rl.seed,
                            max_prompt_len=cfg.model.max_seq_len - rl.max_new_tokens)
    ctrl = Controller(rl, groups, sampler, Keep(), checkpointer=None)
    ctrl.start()
    return cfg, policy, ctrl


def selection_key(cfg, model: Path) -> str:
    """What the start model's pass rates depend on: the model folder, data.pass_rate, the sampling settings rl
    gives them (temperature, top-k, top-p, new tokens) and the reward. Configs that differ elsewhere (rl.lr,
    rl.kl_coef, ...) share one selection, as the pipeline's select_prompts cache shares it between runs."""
    import hashlib
    from dataclasses import asdict

    rl = cfg.rl
    inputs = {"model": str(model.resolve()), "pass_rate": asdict(cfg.data.pass_rate), "reward": asdict(cfg.reward),
              "sampling": [rl.temperature, rl.top_k, rl.top_p, rl.max_new_tokens]}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _selected(cfg, args, name: str) -> Path:
    """OUT/selected/<key>: OUT/ds's train prompts kept by the start model's pass rate (data.pass_rate, the
    pipeline's select_prompts computation, sampled with this config's rl settings); measured once for each
    selection_key and reused by the configs that share it (complete only: the record is written last)."""
    import shutil

    import torch

    from posttrain.eval.pass_rate import select_by_pass_rate

    out = args.out / "selected" / selection_key(cfg, args.model)
    record = out.with_suffix(".json")
    if record.is_file():
        line = json.dumps({"name": name, "pass_rate": {**json.loads(record.read_text()), "reused": out.name}})
        print(line, flush=True)
        with open(args.out / "evaluations.jsonl", "a") as f:
            f.write(line + "\n")
        return out
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    info = select_by_pass_rate(args.model, args.out / "ds", cfg.data.pass_rate, cfg.rl, cfg.reward, out,
                               device="cuda" if torch.cuda.is_available() else "cpu")
    line = json.dumps({"name": name, "pass_rate": {"sampled": info.sampled, "kept": info.kept,
                                                   "never": info.never_solved, "always": info.always_solved,
                                                   "mean_rate": round(info.mean_rate, 4),
                                                   "s": round(time.perf_counter() - t0, 1)}})
    record.write_text(json.dumps(json.loads(line)["pass_rate"]))
    print(line, flush=True)
    with open(args.out / "evaluations.jsonl", "a") as f:
        f.write(line + "\n")
    return out


def _validation(policy, args, max_new_tokens: int):
    """right() -> the policy model's greedy results on the first --eval-n validation problems, in order, as a
    string of "1" (right) and "0" (prompts encoded once)."""
    import torch

    from posttrain.data.chat import encode_prompt
    from posttrain.data.examples import prompt_messages, read_examples
    from posttrain.models.generate import generate

    tok = policy.tok
    validation = read_examples(args.out / "ds", "eval")[: args.eval_n]  # OUT/ds's eval split: the validation split
    prompts = [encode_prompt(tok, prompt_messages(ex)) for ex in validation]

    def right() -> str:
        policy.model.eval()
        with torch.no_grad():
            gens = generate(policy.model, prompts, max_new_tokens=max_new_tokens, temperature=0.0, n=1,
                            eos_id=policy.eos_ids, pad_id=tok.pad_token_id, batch_size=256)
        policy.model.train()
        score = SCORES[args.family]
        return "".join("1" if score(tok.decode(g.response_ids, skip_special_tokens=True), ex["answer"], {}) >= 1.0
                       else "0" for g, ex in zip(gens, validation))
    return right


def one(spec: dict, args) -> None:
    """One config's run, in this process: prints a JSON line per evaluation and a line per step."""
    cfg, policy, ctrl = _controller(spec, args)
    right = _validation(policy, args, cfg.eval.max_new_tokens)
    t0, since = time.perf_counter(), []
    name = spec.get("name", json.dumps(spec.get("rl", {})))
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            bits = right()
            line = json.dumps({"name": name, "step": step, "validation_greedy": bits.count("1") / len(bits),
                               "train_acc": _mean(since, "accuracy"),
                               "entropy": _mean(since, "entropy"), "len": _mean(since, "response_len_mean"),
                               "s": round(time.perf_counter() - t0, 1), "right": bits})
            print(line, flush=True)
            with open(args.out / "evaluations.jsonl", "a") as f:  # every config's, one line per write
                f.write(line + "\n")
            since = []
        if step < args.steps:
            since.append(ctrl.step())
            m = since[-1]  # every step in the config's log (kept when a time limit cuts the run short)
            print(f"step {m.step} acc {m.accuracy:.3f} entropy {m.entropy:.3f} len {m.response_len_mean:.1f} "
                  f"{m.step_s:.1f}s", flush=True)


def _mean(metrics: list, key: str) -> float | None:
    return round(sum(getattr(m, key) for m in metrics) / len(metrics), 4) if metrics else None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="work folder: task/, ds/, model/ (made when absent)")
    ap.add_argument("--model", type=Path, default=None, help="HF folder (default: the `make real-model` folder)")
    ap.add_argument("--gguf", type=Path, default=None, help="de-quantise this GGUF into OUT/model first")
    ap.add_argument("--tools", type=Path, default=None, help="folder with the `gguf` package (for --gguf)")
    ap.add_argument("--fingerprint", default=None, help="expected fingerprint() of the model (sha256 of tensors)")
    ap.add_argument("--recipe", default="small_instruct_lora_cpu")
    ap.add_argument("--family", choices=sorted(SCORES), default="arithmetic",
                    help="bench/real_model.py --family: the default task and the reward (number or word)")
    ap.add_argument("--task", default=None, help="reasoning-gym dataset as JSON (bench/real_model.py --task; default "
                    "the family's); used when OUT/ds is prepared")
    ap.add_argument("--train-task", default=None, help="bench/real_model.py --train-task (--split held_out_first)")
    ap.add_argument("--split", choices=("train_first", "held_out_first"), default="held_out_first",
                    help="bench/real_model.py --split")
    ap.add_argument("--train", type=int, default=2000, help="generated train questions (bench/real_model.py --train)")
    ap.add_argument("--validation-n", type=int, default=256,
                    help="validation questions, what every config is scored on (bench/real_model.py --validation-n)")
    ap.add_argument("--test-n", type=int, default=256, help="test questions, kept out of train and validation and "
                    "never read here (bench/real_model.py --eval: pass the run's, so its test split is this one's)")
    ap.add_argument("--configs", default='[{"name": "recipe"}]', help="JSON list of overrides (+ optional name)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-n", type=int, default=None,
                    help="validation problems scored, the first ones (default: all --validation-n)")
    ap.add_argument("--parallel", type=int, default=1, help="configs run at once, each its own process")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per config process")
    ap.add_argument("--prepare-only", action="store_true")
    ap.add_argument("--table", action="store_true", help="print OUT/evaluations.jsonl as a table and stop")
    ap.add_argument("--baseline", default="recipe", help="--table: the config the others are compared with")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    return ap


def checked(args) -> dict:
    """The data options, refused before anything runs where they would score a config on anything but the
    validation split."""
    if args.eval_n is None:
        args.eval_n = args.validation_n
    if not 1 <= args.eval_n <= args.validation_n:
        raise SystemExit(f"--eval-n {args.eval_n}: configs are scored on the validation split only, "
                         f"1..--validation-n ({args.validation_n}) problems")
    from real_model import task_spec

    for flag, text in (("--task", args.task), ("--train-task", args.train_task)):
        if text is not None:
            task_spec(flag, text)
    check_split(args.split, args.train_task is not None)
    for config in json.loads(args.configs):
        if set(config.get("data", {})) - {"pass_rate"}:
            raise SystemExit(f"--configs: config {config.get('name', '')!r} sets data beyond data.pass_rate; the "
                             "sweep's data is OUT/ds, its evaluation set the validation split (--family, --task, "
                             "--split make it)")
    Sizes(args.train, args.validation_n, args.test_n)
    return options(args)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.table:
        print(table(args.out, args.baseline))
        return 0
    wanted = checked(args)
    if args.one is not None:
        one(json.loads(args.one), args)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if (args.out / "ds").exists():
        check_prepared(args.out, wanted)
    if args.gguf is not None and not (args.out / "model" / "model.safetensors").exists():
        from posttrain.models.smollm2 import convert
        convert(args.tools, args.out / "model", gguf=args.gguf)
    if args.model is None:
        from posttrain.models.smollm2 import default_dir
        args.model = args.out / "model" if args.gguf is not None else default_dir()
    if args.fingerprint is not None:  # a different model is reported, not refused: step 0's accuracy shows it
        got = fingerprint(args.model)
        print(f"fingerprint {got}: {'as expected' if got == args.fingerprint else 'NOT the expected ' + args.fingerprint}",
              flush=True)
    if not (args.out / "ds" / "train.jsonl").exists():
        prepare(args.out, args.recipe, args.model, wanted)
        print(f"fingerprint {fingerprint(args.model)}; dataset {args.out / 'ds'}", flush=True)
    if args.prepare_only:
        return 0
    return run_configs(args)


def run_configs(args) -> int:
    """Every --configs entry in its own process, --parallel at a time; each one's evaluation lines printed as it
    ends. 1 when any failed."""
    configs, running, failed = json.loads(args.configs), [], []
    common = ["--out", str(args.out), "--model", str(args.model), "--recipe", args.recipe, "--steps", str(args.steps),
              "--eval-every", str(args.eval_every), "--eval-n", str(args.eval_n), "--threads", str(args.threads),
              "--family", args.family, "--validation-n", str(args.validation_n)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    while configs or running:
        while configs and len(running) < args.parallel:  # each child writes to its own log (no pipe to fill)
            spec = configs.pop(0)
            log = args.out / "logs" / f"{len(failed) + len(running)}-{time.time_ns()}.txt"
            log.parent.mkdir(exist_ok=True)
            with open(log, "w") as f:
                running.append((spec, log, subprocess.Popen([sys.executable, __file__, *common, "--one",
                                                             json.dumps(spec)], env=env, stdout=f,
                                                            stderr=subprocess.STDOUT, text=True)))
        spec, log, proc = running.pop(0)
        proc.wait()
        text = log.read_text()
        print("".join(line + "\n" for line in text.splitlines() if line.startswith('{"name"')), end="", flush=True)
        if proc.returncode != 0:
            failed.append(spec)
            print(f"FAILED {json.dumps(spec)}:\n{text[-3000:]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
