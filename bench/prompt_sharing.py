"""A prompt's samples through the model once: one RL step's model work on SmolLM2-135M-Instruct, before and after.

    .venv/bin/python bench/prompt_sharing.py                 # against BASE, the commit before prompt sharing
    .venv/bin/python bench/prompt_sharing.py --base REV --reps 3

What a policy rank of small_instruct_sft_rl_cpu does with its 8 prompts x 8 samples a step, timed phase by phase
with the code at `--base` (a git worktree of that commit) and with this checkout, in turn, each case in its own
process on 2 torch threads (the recipe's one policy rank), LoRA rank 16 on the 7 projections:
- `generate`: the rollout, 8 prompts x 8 samples at temperature 0.7 - every row decodes exactly the task's
  typical answer length (no stop id can occur), so both codes do the same work;
- `logprobs`: the old log-probs (and the reference's, the same call with the adapters off): `sequence_logprobs`
  over the 64 rows, no gradient;
- `update`: forward, the response tokens' log-probs and backward over the 64 rows in micro-batches of
  rl.micro_batch_size (4), in rollout order.
Two tasks, with the real chat-templated question of each family (bench/rg_task): chain_sum (a 49-token prompt,
answers of ~3 tokens) and number_sorting (201-token prompt, ~25-token answers); responses are fixed token lists
of that length, the same for both codes. Each case is timed --reps times after a warm-up; the table gives the
median and the before / after ratio, with the load average. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path(os.environ.get("POSTTRAIN_MODELS", Path.home() / ".cache/posttrain/models")) / "SmolLM2-135M-Instruct"
BASE = "a731412"  # the last commit before prompt sharing
QUESTIONS = {  # one train question of each family (bench/rg_task builds them), numbers varied per prompt
    "chain_sum": ("State the final answer to the following arithmetic problem: {a} - {b} + {c} =", 3),
    "sorting": (("Sort these numbers in ascending order: {a}.0, {b}.0, {c}.0, 54.0\nPlease follow the instruction "
                "below:\n## 1. Let all your answers be a list of numbers. Instead of reporting your answer as "
                "-69, -13, 1, 7, 11, 43, 59, 61, use ['-69', '-13', '1', '7', '11', '43', '59', '61'] instead\n"
                "## 2. Convert all numbers in the square brackets as strings. For example, ['-69', '-13', '1', "
                "'7', '11', '43', '59', '61']\n"), 25),
}
PROMPTS, SAMPLES, MICRO = 8, 8, 4
PHASES = ("generate", "logprobs", "update")


def case(phase: str, task: str, reps: int) -> list[float]:
    import torch

    from posttrain.config import LoraConfig
    from posttrain.data.chat import encode_prompt
    from posttrain.models.generate import generate
    from posttrain.models.head_logprobs import response_logprobs, sequence_logprobs
    from posttrain.models.io import load_model, load_tokenizer
    from posttrain.models.lora import add_adapters

    torch.set_num_threads(2)
    model, tok = load_model(MODEL), load_tokenizer(MODEL)
    add_adapters(model, LoraConfig(), seed=0)
    text, answer_len = QUESTIONS[task]
    prompts = [encode_prompt(tok, [{"role": "user", "content": text.format(a=i + 1, b=7, c=i + 3)}])
               for i in range(PROMPTS)]
    g = torch.Generator().manual_seed(0)
    rows = [p for p in prompts for _ in range(SAMPLES)]
    responses = [torch.randint(100, 40000, (answer_len,), generator=g).tolist() for _ in rows]

    def run():
        if phase == "generate":
            model.eval()
            generate(model, prompts, max_new_tokens=answer_len, temperature=0.7, n=SAMPLES,
                     eos_id=[len(tok) + 7], pad_id=tok.pad_token_id, batch_size=PROMPTS * SAMPLES)
        elif phase == "logprobs":
            model.eval()
            sequence_logprobs(model, rows, responses, temperature=0.7, pad_id=tok.pad_token_id)
        else:
            model.train()
            for lo in range(0, len(rows), MICRO):
                logp, _, mask = response_logprobs(model, rows[lo:lo + MICRO], responses[lo:lo + MICRO],
                                                  tok.pad_token_id, temperature=0.7)
                (logp * mask).sum().backward()
            model.zero_grad(set_to_none=True)

    run()  # warm-up
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=BASE, help="the commit to compare against (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if not MODEL.is_dir():
        raise SystemExit("needs the SmolLM2 folder: make real-model")
    before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-share-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.strip()
            print(f"# {Path(__file__).name}: base {args.base} against this checkout ({rev}, uncommitted changes "
                  f"included), {args.reps} reps after a warm-up, 2 torch threads")
            print("## prompt_sharing:")
            print("| task | phase | before s | after s | before / after |")
            print("|---|---|---|---|---|")
            for task in QUESTIONS:
                for phase in PHASES:
                    t = {}
                    for name, src in (("before", base / "src"), ("after", ROOT / "src")):
                        p = subprocess.run([sys.executable, __file__, "--case", phase, task, str(args.reps)],
                                           cwd=ROOT, capture_output=True, text=True, check=False,
                                           env={**os.environ, "PYTHONPATH": str(src)})
                        if p.returncode:
                            raise SystemExit(f"{task} {phase} {name}: exit {p.returncode}\n{p.stderr[-3000:]}")
                        t[name] = statistics.median(json.loads(p.stdout.strip().splitlines()[-1]))
                    print(f"| {task} | {phase} | {t['before']:.2f} | {t['after']:.2f} | "
                          f"x{t['before'] / t['after']:.2f} |", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False,
                           capture_output=True)
    after = os.getloadavg()
    print("load average before " + " ".join(f"{x:.2f}" for x in before) + ", after "
          + " ".join(f"{x:.2f}" for x in after))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--case":
        print(json.dumps(case(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        sys.exit(0)
    sys.exit(main())
