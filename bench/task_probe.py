"""What a model can already do on a reasoning-gym task, before RL: greedy, sampled, pass@k and maj@k accuracy.

    make real-model
    .venv/bin/python bench/task_probe.py                          # the candidates below, 48 problems each
    .venv/bin/python bench/task_probe.py --family spelling        # spell_backward (3-5 letters), the last word
    .venv/bin/python bench/task_probe.py --n 128 --tasks '[{"name": "chain_sum", "min_terms": 2, "max_terms": 3,
        "min_digits": 1, "max_digits": 1}]'

To choose a task for bench/real_model.py (`--task`) without spending an hour of RL on it. For each task it builds
`--n` distinct questions with reasoning-gym (`pip install --target`, as bench/real_model.py does), asks the model
(the `make real-model` folder by default, its own chat template, no system prompt, as the pipeline does) once
greedily and `--k` times at `--temperature`, takes each completion's answer as the family's reward reads it
(`--family`: arithmetic, the last number, reward `number`; spelling, the last word, reward `word`) and scores it
with reasoning-gym's own scorer for the task. It prints, per task: how many distinct questions 4 x n generated
rows hold (a small problem space leaves little to train on once the held-out set is taken), greedy accuracy,
sampled accuracy, pass@k (some sample right) and maj@k (the most common last number right), the share of the
most common answer among the questions (what always giving that answer would score), and three greedy
completions. Its questions are the first distinct ones reasoning-gym makes with seed 1 that
bench/rg_task.split_questions deals to validation (by a hash of the question): bench/real_model.py puts them in
the validation split (`--split held_out_first`) or in train (`train_first`, while 4 x n <= `--train`), never in
test while n <= `--validation-n`, so choosing a task with it is a choice made on validation (until 2026-11-30 it
took the first distinct ones, which validation then held).

How to read it: GRPO mostly sharpens what sampling already finds, so maj@k above greedy is room for a greedy
gain, and pass@k is how often a group of k has a right answer to learn from. A task whose most common answer
covers a large share of the questions can be "learnt" by always giving that answer - check it before believing a
gain.

Measured (2026-11-26, bench/results/real-model-tasks-2026-11-26.txt, SmolLM2-135M-Instruct, n 48, k 8, T 0.7,
32 new tokens): chain_sum (2-3 one-digit terms) greedy 0.250, maj@8 0.333, pass@8 0.500; gcd (1-20) greedy
0.208, maj@8 0.229, pass@8 0.688, but its answers are skewed to 1: with bench/real_model.py's split, 0.44 of the
held-out questions and 0.94 of the train rows have the answer 1, and RL on it (bench/real_model_sweep.py --task)
went 0.164 -> 0.441 held-out greedy in 10 steps - exactly the share whose answer is 1.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_model import MODEL
from rg_task import FAMILIES, TASK, install_reasoning_gym, side

CANDIDATES = [
    TASK,
    {"name": "simple_equations", "min_terms": 2, "max_terms": 2, "min_value": 1, "max_value": 10,
     "operators": ["+", "-"], "operators_weights": [0.5, 0.5]},
    {"name": "leg_counting", "min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3},
    {"name": "gcd", "min_value": 1, "max_value": 20},
    {"name": "lcm", "min_value": 1, "max_value": 12},
    {"name": "basic_arithmetic", "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
     "operators": ["+", "-"], "allow_parentheses": False, "allow_negation": False},
]


def probe(spec: dict, model, tok, eos: list[int], args) -> dict:
    """One task's figures (see the module docstring)."""
    import reasoning_gym as rg
    import torch
    from reasoning_gym import get_score_answer_fn

    from posttrain.data.chat import encode_prompt
    from posttrain.models.generate import generate

    t0, spec = time.perf_counter(), dict(spec)
    name = spec.pop("name")
    rows = list({r["question"]: r for r in rg.create_dataset(name, size=4 * args.n, seed=1, **spec)}.values())
    distinct = len(rows)
    rows = [r for r in rows if side(r["question"]) == "validation"]  # never a test question
    if len(rows) < args.n:
        raise SystemExit(f"{name}: only {len(rows)} distinct validation questions in {4 * args.n} rows; --n {args.n} "
                         "needs more")
    rows = rows[: args.n]
    score = get_score_answer_fn(name)

    def right(answer: str | None, row: dict) -> bool:
        return score(answer, {"answer": row["answer"], "metadata": row["metadata"]}) >= 1.0

    prompts = [encode_prompt(tok, [{"role": "user", "content": r["question"]}]) for r in rows]
    with torch.no_grad():
        greedy = generate(model, prompts, max_new_tokens=args.max_new_tokens, temperature=0.0, eos_id=eos,
                          pad_id=tok.pad_token_id)
        sampled = generate(model, prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           n=args.k, eos_id=eos, pad_id=tok.pad_token_id, seed=0)
    g_text = [tok.decode(x.response_ids, skip_special_tokens=True) for x in greedy]
    last = FAMILIES[args.family].extract  # the answer as the family's reward reads it
    s_last = [last(tok.decode(x.response_ids, skip_special_tokens=True)) for x in sampled]
    k, n = args.k, args.n
    s_right = [[right(s_last[i * k + j], r) for j in range(k)] for i, r in enumerate(rows)]
    majority = [collections.Counter(s_last[i * k:(i + 1) * k]).most_common(1)[0][0] for i in range(n)]
    common, count = collections.Counter(r["answer"] for r in rows).most_common(1)[0]
    return {"task": name, **spec, "distinct_of_4n": distinct,
            "greedy": round(sum(right(last(c), r) for c, r in zip(g_text, rows)) / n, 3),
            "sampled": round(sum(map(sum, s_right)) / (n * k), 3),
            f"pass@{k}": round(sum(any(x) for x in s_right) / n, 3),
            f"maj@{k}": round(sum(right(m, r) for m, r in zip(majority, rows)) / n, 3),
            "most_common_answer": common, "its_share": round(count / n, 3), "s": round(time.perf_counter() - t0),
            "examples": [[r["question"][-70:], c[:70], r["answer"]] for c, r in list(zip(g_text, rows))[:3]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), default="arithmetic",
                    help="how a completion's answer is read (arithmetic: its last number; spelling: its last word)")
    ap.add_argument("--tasks", default=None, help="JSON list of {name, config fields} (default: the candidates "
                    "below for arithmetic, the family's task for another family)")
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--n", type=int, default=48, help="distinct questions per task")
    ap.add_argument("--k", type=int, default=8, help="samples per question")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if not (args.model / "model.safetensors").is_file():
        raise SystemExit(f"{args.model}: no model folder; run `make real-model` first")
    sys.path.insert(0, str(install_reasoning_gym()))
    import torch

    from posttrain.models.io import eos_token_ids, load_model, load_tokenizer

    torch.set_num_threads(args.threads)
    tok, model = load_tokenizer(args.model), load_model(args.model)
    eos = eos_token_ids(args.model, tok)
    default = CANDIDATES if args.family == "arithmetic" else [FAMILIES[args.family].task]
    for spec in json.loads(args.tasks) if args.tasks is not None else default:
        print(json.dumps(probe(spec, model, tok, eos, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
