"""SFT throughput: the SPMD trainer against a plain single-process torch loop, measured in the same run.

Baseline: the same model (tiny_cpu), data, global batch, fp32 and total thread count, trained by a plain
loop written the obvious way (pad each micro-batch, HF forward, masked cross-entropy, AdamW). Then the
SPMD trainer (`run_sft` under torchrun) with 1 and 2 ranks, packing off and on. Tokens/s counts real
(non-pad) tokens over the training loop; "wall" is the whole launch including imports, tokenisation and
process-group start-up. Prints ratios against the baseline.

    .venv/bin/python bench/sft.py [--steps 60]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

TRAIN = r"""
import json, sys
from dataclasses import replace
from pathlib import Path
from posttrain.config import TrackingConfig
from posttrain.recipes import tiny_cpu
from posttrain.sft import run_sft
d, steps, pack, out = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", Path(sys.argv[4])
import os
c = tiny_cpu()
sft = replace(c.sft, steps=steps, nproc=int(os.environ["WORLD_SIZE"]), packing=pack, save_every=0, warmup_steps=5)
m = run_sft(model_cfg=c.model, sft_cfg=sft, tracking_cfg=TrackingConfig(wandb=False, log_every=10**6),
            dataset_dir=d / "ds", tokenizer_dir=d / "tok", base_model_dir=None, out_dir=out / "model",
            state_dir=out / "state")
if os.environ["RANK"] == "0":
    (out / "m.json").write_text(json.dumps(m))
"""


def plain_loop(d: Path, steps: int) -> float:
    """The baseline: a straightforward single-process loop; returns tokens/s."""
    from dataclasses import replace  # noqa: F401

    from posttrain.data.chat import tokenize_for_training
    from posttrain.data.examples import read_examples
    from posttrain.models.io import load_tokenizer
    from posttrain.models.tiny import build_model
    from posttrain.recipes import tiny_cpu

    torch.set_num_threads(2)
    c = tiny_cpu()
    tok = load_tokenizer(d / "tok")
    model = build_model(c.model, tok).train()
    opt = torch.optim.AdamW(model.parameters(), lr=c.sft.lr, betas=(0.9, 0.95))
    enc = [tokenize_for_training(tok, e["messages"], c.model.max_seq_len) for e in read_examples(d / "ds", "train")]
    g, mb = c.sft.global_batch_size, c.sft.micro_batch_size
    tokens, t0 = 0, None
    for step in range(steps + 5):
        if step == 5:  # warm-up excluded, as for the trainer's steady state
            t0, tokens = time.perf_counter(), 0
        batch = enc[(step * g) % (len(enc) - g):][:g]
        n_loss = sum(sum(m) for _, m in batch)
        for j in range(0, g, mb):
            part = batch[j:j + mb]
            T = max(len(i) for i, _ in part)
            ids = torch.full((len(part), T), tok.pad_token_id)
            att = torch.zeros((len(part), T), dtype=torch.long)
            lab = torch.full((len(part), T), -100)
            for r, (i, m) in enumerate(part):
                ids[r, :len(i)] = torch.tensor(i)
                att[r, :len(i)] = 1
                lab[r, :len(i) - 1] = torch.tensor([t if k else -100 for t, k in zip(i[1:], m[1:])])
                tokens += len(i)
            logits = model(input_ids=ids, attention_mask=att).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab.reshape(-1),
                                                     ignore_index=-100, reduction="sum") / n_loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    return tokens / (time.perf_counter() - t0)


def trainer(d: Path, nproc: int, steps: int, pack: bool) -> tuple[float, float]:
    """(tokens/s over the training loop, wall seconds of the whole launch)."""
    import json

    out = Path(tempfile.mkdtemp(dir=d))
    script = d / "train.py"
    script.write_text(TRAIN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                    str(script), str(d), str(steps), "1" if pack else "0", str(out)], check=True, cwd=ROOT,
                   capture_output=True, env={**os.environ, "OMP_NUM_THREADS": str(2 // nproc)})
    wall = time.perf_counter() - t0
    m = json.loads((out / "m.json").read_text())
    return m["tokens"] * steps / m["wall_s"], wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    from posttrain.data.prepare import prepare_dataset
    from posttrain.models.tokenizer import tokenizer_training_texts, train_tokenizer
    from posttrain.recipes import tiny_cpu

    d = Path(tempfile.mkdtemp(prefix="bench-sft-"))
    data = tiny_cpu().data
    prepare_dataset(data, d / "ds")
    train_tokenizer(tokenizer_training_texts(d / "ds"), data.tokenizer.vocab_size, d / "tok")
    base = plain_loop(d, args.steps)
    rows = [("plain torch loop, 1 process x 2 threads", base, None)]
    for nproc in (1, 2):
        for pack in (False, True):
            tps, wall = trainer(d, nproc, args.steps, pack)
            rows.append((f"SPMD trainer, {nproc} rank(s), packing {'on' if pack else 'off'}", tps, wall))
    print(f"\nSFT throughput, tiny_cpu model, global batch {tiny_cpu().sft.global_batch_size}, {args.steps} steps, "
          f"{os.cpu_count()} cores")
    print(f"{'configuration':<46} {'tokens/s':>10} {'vs plain':>9} {'launch wall s':>14}")
    for name, tps, wall in rows:
        print(f"{name:<46} {tps:>10.0f} {tps / base:>8.2f}x {'' if wall is None else f'{wall:.1f}':>14}")


if __name__ == "__main__":
    main()
