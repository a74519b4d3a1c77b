"""TRL's GRPOTrainer on the same work as the project's GRPO: the TRL side of `bench/rl.py --sections trl`.

Runs inside the throwaway TRL environment (`.venv/bin/python` with the folder that `bench/rl_vs_trl.py`
installs TRL into first on PYTHONPATH), started by bench/rl_vs_trl.py as a subprocess:

    PYTHONPATH=<cache>/trl-1.16.0 .venv/bin/python bench/rl_trl.py IN.json OUT.json

IN.json: {model_dir, out_dir, threads, seed, rl: the project's RLConfig as a dict, prompts: [{text, ids, answer,
task}] - the project's PromptSampler order, steps x prompts_per_step rows, lora: the project's LoraConfig as a
dict or null}. OUT.json: {wall_s (train() only),
generated_tokens (completion tokens up to and including EOS, counted in the reward function from TRL's
EOS-masked completion ids), step_s (per optimizer step), reward_mean per step, versions}. The final model is
saved with the project's `save_model` (safetensors) to out_dir/model.

How each TRL setting maps to the project's GRPO (src/posttrain/rl/: controller, roles/policy.py, algorithms/grpo.py):
- one step = one generation batch of prompts_per_step x samples_per_prompt completions and ONE optimizer step:
  num_generations = samples_per_prompt; per_device_train_batch_size = rl.micro_batch_size;
  gradient_accumulation_steps = steps_per_generation = P x N / micro batch; num_iterations = inner_epochs;
  max_steps = rl.steps.
- prompts: the same rows in the same order (shuffle_dataset=False over the project's sampler order), given as
  the chat-rendered text; checked here to tokenize to exactly the project's prompt ids.
- advantages: scale_rewards "group" (std_normalize) / "none": (r - group mean) / (unbiased group std + eps).
- loss: rl.loss_agg token_mean -> loss_type "dapo" (sum over the generation batch's tokens / their count);
  seq_mean -> "grpo" (per-sequence token mean, mean over sequences). epsilon = clip_low, epsilon_high =
  clip_high, beta = kl_coef (TRL's KL is k3, the project's default estimator).
- optimizer: AdamW(lr, betas (0.9, 0.99), eps 1e-8, weight_decay 0) as the project's policy builds it, and the
  project's warm-up, lr x min(1, (update + 1) / warmup_steps) then constant, handed to the trainer as
  `optimizers=` (HF's "constant_with_warmup" starts at lr 0 instead); max_grad_norm = rl.max_grad_norm.
- sampling: max_completion_length = max_new_tokens, temperature, top_p, top_k; stop at the model's EOS ids.
- reward: the project's built-in verifier (posttrain.data.verifiers.score) on the completion decoded with
  skip_special_tokens=True, as the project's reward workers score it.
Unavoidable differences: TRL's advantage eps is 1e-4 (the project's 1e-6; only matters for groups whose
rewards barely differ, which binary rewards never do); TRL runs in one process (generation, then the update
with 2 torch threads) where the project runs Ray actors (2 policy ranks at 1 thread, one rollout worker);
TRL's generation is transformers' `generate` over the whole generation batch at once.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def grpo_config(spec: dict):
    """TRL's GRPOConfig doing the project's step: one generation batch of P x N completions, one optimizer step."""
    from trl import GRPOConfig

    rl = spec["rl"]
    n, per_step = rl["samples_per_prompt"], rl["prompts_per_step"]
    micro = min(rl["micro_batch_size"], per_step * n)
    if (per_step * n) % micro:
        raise SystemExit(f"prompts_per_step x samples_per_prompt = {per_step * n} is not a multiple of {micro}")
    accum = per_step * n // micro
    return GRPOConfig(
        output_dir=str(Path(spec["out_dir"]) / "trainer"), max_steps=rl["steps"], num_generations=n,
        per_device_train_batch_size=micro, gradient_accumulation_steps=accum, steps_per_generation=accum,
        num_iterations=rl["inner_epochs"], learning_rate=rl["lr"], max_grad_norm=rl["max_grad_norm"] or 1e9,
        beta=rl["kl_coef"], epsilon=rl["clip_low"], epsilon_high=rl["clip_high"],
        loss_type="dapo" if rl["loss_agg"] == "token_mean" else "grpo",
        scale_rewards="group" if rl["std_normalize"] else "none", max_completion_length=rl["max_new_tokens"],
        temperature=rl["temperature"], top_p=rl["top_p"], top_k=rl["top_k"], shuffle_dataset=False,
        seed=spec["seed"], use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=10,
        disable_dropout=True, log_completions=False, remove_unused_columns=False, dataloader_num_workers=0)


def project_optimizer(model, rl: dict):
    """The project's policy optimizer and warm-up: AdamW(betas 0.9/0.99, eps 1e-8, no decay), lr x min(1, (u+1)/w),
    over the parameters that train (with LoRA: the adapters)."""
    import torch

    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=rl["lr"], betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    warm = rl["warmup_steps"]
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 if warm <= 0 else min(1.0, (s + 1) / warm))


def counting_verifier(tok, counted: dict):
    """The project's verifier as a TRL reward function; counts generated tokens and the mean reward per call."""
    from posttrain.data.verifiers import score

    def verifier(prompts, completions, completion_ids, answer, task, **_):
        texts = [tok.decode(ids, skip_special_tokens=True) for ids in completion_ids]
        scores = [score(t, c, a) for t, c, a in zip(task, texts, answer)]
        counted["tokens"] += sum(len(ids) for ids in completion_ids)  # EOS-masked: up to and including EOS
        counted["rewards"].append(sum(scores) / len(scores))
        return scores

    return verifier


def step_clock():
    """A TrainerCallback recording each optimizer step's wall time in `.steps`."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.t, self.steps = time.perf_counter(), []

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            self.steps.append(now - self.t)
            self.t = now

    return StepClock()


def main(in_path: str, out_path: str) -> int:
    import importlib.metadata as md

    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    from posttrain.models.io import load_model, load_tokenizer, save_model

    spec = json.loads(Path(in_path).read_text())
    rl, prompts = spec["rl"], spec["prompts"]
    torch.set_num_threads(spec["threads"])
    tok = load_tokenizer(spec["model_dir"])
    model = load_model(spec["model_dir"])
    for p in prompts:  # TRL tokenizes a text prompt with processing_class(text=...): it must give the same ids
        if tok(text=p["text"])["input_ids"] != p["ids"]:
            raise SystemExit(f"prompt tokenization differs from the project's: {p['text']!r}")
    if spec.get("lora"):  # the project's model.lora as peft's config; TRL's reference is then the adapters-off base
        from peft import LoraConfig, get_peft_model

        lo = spec["lora"]
        model = get_peft_model(model, LoraConfig(r=lo["rank"], lora_alpha=lo["alpha"], lora_dropout=lo["dropout"],
                                                 target_modules=lo["target_modules"], bias="none",
                                                 task_type="CAUSAL_LM"))
    args, counted, clock = grpo_config(spec), {"tokens": 0, "rewards": []}, step_clock()
    data = Dataset.from_list([{"prompt": p["text"], "answer": p["answer"], "task": p["task"]} for p in prompts])
    trainer = GRPOTrainer(model=model, reward_funcs=counting_verifier(tok, counted), args=args, train_dataset=data,
                          processing_class=tok, optimizers=project_optimizer(model, rl), callbacks=[clock])
    print(f"trl: eos ids {trainer.eos_token_ids}, {rl['steps']} steps of {rl['prompts_per_step']} x "
          f"{rl['samples_per_prompt']}, micro {args.per_device_train_batch_size} x {args.gradient_accumulation_steps}, "
          f"torch threads {torch.get_num_threads()}", flush=True)
    clock.t = t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    final = trainer.model.merge_and_unload() if spec.get("lora") else trainer.model  # a plain model to score
    save_model(final, tok, Path(spec["out_dir"]) / "model")
    out = {"wall_s": wall, "generated_tokens": counted["tokens"], "step_s": clock.steps,
           "reward_mean": counted["rewards"], "torch_threads": torch.get_num_threads(),
           "versions": {p: md.version(p) for p in ("trl", "accelerate", "transformers", "torch", "peft")},
           "trained_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)}
    Path(out_path).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
