"""Where a decode step's time goes on CPU, and whether a static KV cache or a compiled step pays: one decode
step of SmolLM2-135M-Instruct at small_instruct_cpu's rollout batch, four ways, in one process and one run.

    .venv/bin/python bench/decode_step.py                 # batch 32 (8 prompts x 4 samples), 64 new tokens
    .venv/bin/python bench/decode_step.py --batch 64 --prompt-len 120
    .venv/bin/python bench/decode_step.py --write-docs    # and write the table into docs/results.md

Rows: `dynamic` - the project's decoding (posttrain.models.generate: transformers' DynamicCache, which grows
every layer's keys and values by one column per step); `static` - transformers' StaticCache (keys and values
preallocated for prompt + new tokens, written in place, attention over the whole preallocated length under
the mask); `static + torch.compile` - the same with the model compiled (inductor, static shapes; its
compile time is printed apart); `Linear layers only` - every nn.Linear of the model (lm_head included) on a
batch of one-token inputs, no attention, no cache, no norms: the floor that neither change can go below.
Each decoding row is greedy from the same random prompt ids (token ids equal across rows are checked), timed
over every step after the first, median of `--repeats`; ms per step and the ratio to `dynamic`, with the load
average and versions. Needs the folder `make real-model` builds.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def decode(model, forward, ids, new_tokens: int, static: bool):
    """Greedy decoding of `ids` (B, P): (token ids (B, new_tokens - 1), seconds per step after the first)."""
    import torch
    from transformers import DynamicCache, StaticCache

    B, P = ids.shape
    cache = StaticCache(config=model.config, max_cache_len=P + new_tokens) if static else DynamicCache()
    mask = torch.zeros((B, P + new_tokens if static else P), dtype=torch.long)
    mask[:, :P] = 1
    pos = torch.arange(P)[None].expand(B, P)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                       logits_to_keep=1).logits[:, -1]
        nxt, out, t1 = pos[:, -1:] + 1, [], 0.0
        for t in range(new_tokens - 1):
            tok = logits.argmax(-1)
            out.append(tok)
            if static:
                mask[:, P + t] = 1
            else:
                mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype)], dim=1)
            logits = forward(input_ids=tok[:, None], attention_mask=mask, position_ids=nxt, past_key_values=cache,
                             use_cache=True).logits[:, -1]
            nxt = nxt + 1
            if t == 0:
                t1 = time.perf_counter()
    return torch.stack(out, 1), (time.perf_counter() - t1) / (new_tokens - 2)


def linear_floor(model, batch: int) -> float:
    """Seconds for every nn.Linear of the model on (batch, in_features) inputs: one decode step's matmuls."""
    import torch

    lins = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    xs = {lin.in_features: torch.randn(batch, lin.in_features) for lin in lins}
    with torch.no_grad():
        for lin in lins:
            lin(xs[lin.in_features])
        t0 = time.perf_counter()
        for _ in range(10):
            for lin in lins:
                lin(xs[lin.in_features])
    return (time.perf_counter() - t0) / 10


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32, help="rows decoded at once (small_instruct_cpu: 8 x 4)")
    ap.add_argument("--prompt-len", type=int, default=60, help="prompt tokens per row")
    ap.add_argument("--new-tokens", type=int, default=64, help="small_instruct_cpu's rl.max_new_tokens")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (small_instruct_cpu's torch_threads)")
    ap.add_argument("--write-docs", action="store_true", help="write the table into its block in docs/results.md")
    args = ap.parse_args(argv)

    import torch

    from posttrain.models.io import load_model
    from posttrain.models.smollm2 import build

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    model = load_model(str(build()), device=torch.device("cpu")).eval()
    ids = torch.randint(100, 10000, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    compiled = torch.compile(model, dynamic=False)
    decode(model, compiled, ids, args.new_tokens, static=True)  # compiles (and warms) the one-token step
    compile_s = time.perf_counter() - t0

    rows, ref = [], None
    for name, forward, static in (("dynamic (the project's)", model, False), ("static", model, True),
                                  ("static + torch.compile", compiled, True)):
        times = []
        for _ in range(args.repeats):
            toks, s = decode(model, forward, ids, args.new_tokens, static)
            times.append(s)
            ref = toks if ref is None else ref
            if not torch.equal(toks, ref):
                raise SystemExit(f"{name}: greedy token ids differ from the dynamic cache's")
        rows.append((name, statistics.median(times), min(times), max(times)))
    floor = statistics.median(linear_floor(model, args.batch) for _ in range(args.repeats))
    base = rows[0][1]
    table = ["| decoding | ms per step (min-max) | x the project's |", "|---|---|---|"]
    for name, med, lo, hi in rows:
        table.append(f"| {name} | {med * 1e3:.0f} ({lo * 1e3:.0f}-{hi * 1e3:.0f}) | x{base / med:.2f} |")
    table.append(f"| every `nn.Linear` alone, no attention or cache (the floor) | {floor * 1e3:.0f} | x{base / floor:.2f} |")
    load = os.getloadavg()
    head = (f"SmolLM2-135M-Instruct decode step, batch {args.batch}, prompt {args.prompt_len} tokens, "
            f"{args.new_tokens} new tokens, greedy, fp32; median of {args.repeats} (token ids equal in every row)")
    tail = (f"torch.compile: {compile_s:.0f} s to compile the step; load average before {load_before[0]:.2f}, after "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs, torch threads {args.threads}; torch "
            f"{torch.__version__}, transformers {importlib.metadata.version('transformers')}")
    print("\n" + head + "\n" + "\n".join(table) + "\n\n" + tail)
    if args.write_docs:
        from default_seeds import _commit, write_block

        block = "\n".join([head + ":", "", *table, "",
                            (f"{tail}. Command: `.venv/bin/python bench/decode_step.py {' '.join(sys.argv[1:])}` "
                            f"({time.strftime('%Y-%m-%d')}, commit {_commit()}).")])
        print(f"wrote the table into {write_block(block, '<!-- decode_step:begin -->', '<!-- decode_step:end -->')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
