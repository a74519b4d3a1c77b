"""Where a LoRA policy rank's memory goes, phase by phase, on SmolLM2-135M-Instruct (one process per case).

    .venv/bin/python bench/policy_phases.py

Each case runs in its own process (so no case inherits another's allocator state), on 1 torch thread, with the
model as a policy rank holds it (fp32, LoRA rank 16 on the 7 projections; gradient checkpointing for the
update) and reports the peak RSS above the process's rest (VmHWM after /proc/self/clear_refs) and the time:
- `update old|new`: one micro-batch of 4 sequences (40 prompt + 64 response tokens) - forward, the response
  tokens' log-probs, backward - through the whole-logits path (`forward_response_logits` + `sampling_logprobs`)
  or the chunked head (`head_logprobs.response_logprobs`, what the policy runs); 3 micro-batches after one
  warm-up, the mean time;
- `generate 512|32`: the rollout a policy rank generates with placement.rollout_workers 0 - 8 prompts x 8
  samples, up to 64 new tokens - all rows at once (the default) or in batches of 32 (`rl.policy_generate_batch`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path(os.environ.get("POSTTRAIN_MODELS", Path.home() / ".cache/posttrain/models")) / "SmolLM2-135M-Instruct"
CASES = [("update", "old"), ("update", "new"), ("generate", "512"), ("generate", "32")]


def _rss() -> tuple[float, float]:
    d = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(d["VmRSS"].split()[0]) / 2**20, int(d["VmHWM"].split()[0]) / 2**20


def case(phase: str, how: str) -> str:
    import torch

    from posttrain.config import LoraConfig
    from posttrain.models.generate import forward_response_logits, generate, sampling_logprobs
    from posttrain.models.head_logprobs import response_logprobs
    from posttrain.models.io import enable_gradient_checkpointing, load_model
    from posttrain.models.lora import add_adapters

    torch.set_num_threads(1)
    model = load_model(MODEL)
    add_adapters(model, LoraConfig(), seed=0)
    g = torch.Generator().manual_seed(0)
    if phase == "update":
        model.train()
        enable_gradient_checkpointing(model)
        prompts = [torch.randint(100, 40000, (40,), generator=g).tolist() for _ in range(4)]
        responses = [torch.randint(100, 40000, (64,), generator=g).tolist() for _ in range(4)]

        def run():
            if how == "old":
                logits, targets, mask = forward_response_logits(model, prompts, responses, 0)
                logp = sampling_logprobs(logits, targets, 1.0)
            else:
                logp, _, mask = response_logprobs(model, prompts, responses, 0, temperature=1.0)
            (logp * mask).sum().backward()
            model.zero_grad(set_to_none=True)
        reps = 3
    else:
        model.eval()
        prompts = [torch.randint(100, 40000, (40,), generator=g).tolist() for _ in range(8)]

        def run():
            generate(model, prompts, max_new_tokens=64, temperature=1.0, n=8, eos_id=[2], pad_id=0,
                     batch_size=int(how))
        reps = 1
    run()  # warm-up
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    rest, _ = _rss()
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    dt = (time.perf_counter() - t0) / reps
    _, peak = _rss()
    return f"| {phase} | {how} | {rest:.2f} | {peak:.2f} | +{peak - rest:.2f} | {dt:.2f} |"


def main() -> int:
    if not MODEL.is_dir():
        raise SystemExit("needs the SmolLM2 folder: make real-model")
    print("| phase | how | rest GiB | peak GiB | above rest GiB | s per micro-batch / rollout |")
    print("|---|---|---|---|---|---|")
    for phase, how in CASES:
        p = subprocess.run([sys.executable, __file__, phase, how], cwd=ROOT, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, check=False)
        if p.returncode:
            raise SystemExit(f"{phase} {how}: exit {p.returncode}\n{p.stderr[-3000:]}")
        print(p.stdout.strip().splitlines()[-1], flush=True)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3:
        print(case(sys.argv[1], sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
