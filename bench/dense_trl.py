"""TRL's DPOTrainer on the same work as the project's DPO: the TRL side of `bench/dense.py`.

Runs inside the throwaway TRL environment (`.venv/bin/python` with the folder that `bench/rl_vs_trl.py`
installs TRL into first on PYTHONPATH), started by bench/dense.py as a subprocess:

    PYTHONPATH=<cache>/trl-1.16.0-... .venv/bin/python bench/dense_trl.py IN.json OUT.json

IN.json: {model_dir (the start model, also the reference), out_dir, threads, seed, dpo: the project's DPOConfig
as a dict, rows: [{prompt, chosen, rejected, chosen_ids, rejected_ids, chosen_mask, rejected_mask}] - the pairs
in the order the project's trainer visits them, step by step (steps x global_batch_size rows; a data set smaller
than that repeats, as the project's next epoch does). OUT.json: {wall_s (train() only), step_s (per optimizer
step), tokens (TRL's own num_tokens: the attention-mask sum, i.e. non-pad tokens of chosen + rejected),
tokens_counted (the same summed from the rows), loss (per step), versions, torch_threads}. The trained
model is saved with the project's `save_model` (save_pretrained + the tokenizer) to out_dir/model.

How each TRL setting maps to the project's DPO (src/posttrain/sft/trainer.py, objectives.py, losses.py):
- batch: per_device_train_batch_size = dpo.micro_batch_size pairs, gradient_accumulation_steps =
  global_batch_size / micro_batch_size (one process), max_steps = dpo.steps.
- data: conversational preference rows (prompt = the prompt turns, chosen / rejected = one assistant turn each,
  from posttrain.data.examples), train_sampling_strategy "sequential" over rows already in the project's order,
  so both see the same pairs in the same micro-batches. Checked here: TRL's tokenized prompt+chosen and
  prompt+rejected ids and completion masks equal the project's (tokenize_for_training) for every row.
- loss: loss_type ["sigmoid"], beta, label_smoothing 0 - the project's dpo_losses; summed completion log-probs;
  reference in the loop (precompute_ref_log_probs False; ref_model = a second load of the start folder, as the
  project's frozen copy); padding_free False, no packing, max_length None (bench/dense.py refuses pairs longer
  than model.max_seq_len, which the project would drop: neither side drops or truncates), pad_to_multiple_of None.
- optimizer and schedule: the project's own `make_optimizer` (AdamW betas 0.9/0.95, eps 1e-8, weight decay on
  >= 2-D parameters only) and `lr_at` (linear warm-up, cosine to lr x min_lr_ratio) as a LambdaLR, handed to the
  trainer as `optimizers=`; HF's "cosine_with_min_lr" is the same curve at warm-up 0, and this leaves no room
  for a difference. max_grad_norm = dpo.max_grad_norm. fp32 (use_cpu, no bf16), dropout off (none anyway).
Unavoidable differences: TRL pads each micro-batch's 2 x micro sequences to its longest (right padding) where
the project packs them into rows of model.max_seq_len tokens with a block-diagonal mask - both count only
non-pad tokens; TRL computes log-probs through its fused lm-head path, the project through a full-vocabulary
cross-entropy; the project wraps the model in DDP (a world of one) and saves its resumable state at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ siblings: rl_trl (the step clock)


def dpo_args(spec: dict):
    """TRL's DPOConfig doing the project's step: global_batch_size pairs, micro-batches of micro_batch_size."""
    from trl import DPOConfig

    d = spec["dpo"]
    if d["global_batch_size"] % d["micro_batch_size"]:
        raise SystemExit(f"global_batch_size {d['global_batch_size']} is not a multiple of {d['micro_batch_size']}")
    return DPOConfig(
        output_dir=str(Path(spec["out_dir"]) / "trainer"), max_steps=d["steps"],
        per_device_train_batch_size=d["micro_batch_size"],
        gradient_accumulation_steps=d["global_batch_size"] // d["micro_batch_size"],
        learning_rate=d["lr"], max_grad_norm=d["max_grad_norm"] or 1e9, beta=d["beta"], loss_type=["sigmoid"],
        label_smoothing=d["label_smoothing"], precompute_ref_log_probs=False, padding_free=False,
        pad_to_multiple_of=None, max_length=None, train_sampling_strategy="sequential", seed=spec["seed"],
        use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1, disable_dropout=True,
        dataloader_num_workers=0)


def project_optimizer(model, dpo: dict):
    """The project's own optimizer and lr schedule (posttrain.sft.trainer), so neither can differ."""
    import torch

    from posttrain.config import DPOConfig, from_dict
    from posttrain.sft.trainer import lr_at, make_optimizer

    cfg = from_dict(DPOConfig, dpo)
    opt = make_optimizer(model, cfg)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, cfg) / cfg.lr)


def check_tokenization(dataset, rows: list[dict]) -> None:
    """TRL's tokenized rows must be the project's sequences, token for token, with the same loss tokens."""
    for i, (got, want) in enumerate(zip(dataset, rows)):
        p = got["prompt_ids"]
        for side in ("chosen", "rejected"):
            ids, mask = p + got[f"{side}_ids"], [0] * len(p) + [1] * len(got[f"{side}_ids"])
            if ids != want[f"{side}_ids"] or mask != want[f"{side}_mask"]:
                raise SystemExit(f"row {i} {side}: TRL's tokens {ids} / mask {mask} differ from the project's "
                                 f"{want[f'{side}_ids']} / {want[f'{side}_mask']}")


def main(in_path: str, out_path: str) -> int:
    import importlib.metadata as md

    import torch
    from datasets import Dataset
    from rl_trl import step_clock
    from trl import DPOTrainer

    from posttrain.models.io import load_model, load_tokenizer, save_model

    spec = json.loads(Path(in_path).read_text())
    dpo, rows = spec["dpo"], spec["rows"]
    torch.set_num_threads(spec["threads"])
    tok = load_tokenizer(spec["model_dir"])
    model, ref = load_model(spec["model_dir"]), load_model(spec["model_dir"])
    args, clock = dpo_args(spec), step_clock()
    data = Dataset.from_list([{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in rows])
    trainer = DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=data, processing_class=tok,
                         optimizers=project_optimizer(model, dpo), callbacks=[clock])
    check_tokenization(trainer.train_dataset, rows)
    print(f"trl: {dpo['steps']} steps of {dpo['global_batch_size']} pairs, micro {args.per_device_train_batch_size} x "
          f"{args.gradient_accumulation_steps}, {len(rows)} rows (tokenization checked), torch threads "
          f"{torch.get_num_threads()}", flush=True)
    clock.t = t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    save_model(trainer.model, tok, Path(spec["out_dir"]) / "model")
    logs = [h for h in trainer.state.log_history if "loss" in h]
    out = {"wall_s": wall, "step_s": clock.steps, "tokens": int(trainer._total_train_tokens),
           "tokens_counted": sum(len(r["chosen_ids"]) + len(r["rejected_ids"]) for r in rows),
           "loss": [h["loss"] for h in logs], "accuracy": [h.get("rewards/accuracies") for h in logs],
           "torch_threads": torch.get_num_threads(),
           "versions": {p: md.version(p) for p in ("trl", "accelerate", "transformers", "torch")}}
    Path(out_path).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
