"""Reward-model role: learned reward models score each sample - the prompt turns plus the completion as the
assistant's turn, rendered with EACH model's own tokenizer and chat template - through the model's own pooled
forward (`models.reward_model.score_conversations`: the score at the last non-pad token, as a user of the saved
folder gets it from transformers). Any folder that `AutoModelForSequenceClassification` loads with one output
works: a `reward_model` artifact of this project or a third-party one; safetensors only, no remote code.

`RewardModelGroup.score` splits the samples across its workers balanced by length (characters of prompt and
completion: each model has its own tokenizer, so characters are the one measure they share), gathers with the
remote timeout and merges in order. Every worker holds every model of `reward.models`. The models sit on the
worker's device (`local_device()`: the GPU Ray assigned it, else CPU), in bf16 on CUDA when model.dtype is
BF16. A non-finite score is not a failure to tolerate: the controller stops the step before the update.

How the scores become the reward: the registry row says `scores=True`, so every loop's score phase
(loops.common.score) asks this group and adds `weighted` - the sum of reward.model_weights[i] x model i's score -
to reward.fn_weight x the functions' score. Nothing else names this role.
"""

from __future__ import annotations

import time

import torch

from posttrain.config import DType, ModelConfig
from posttrain.models.io import load_tokenizer, local_device
from posttrain.models.reward_model import load_reward_model, score_conversations
from posttrain.rl import dispatch
from posttrain.rl.remote import gather
from posttrain.rl.roles.common import set_torch_threads, where, worker_identity
from posttrain.rl.types import Scores, Trajectories, WorkerId


class RewardModelWorker:
    def __init__(self, models: list[str], rank: int, world_size: int, model_cfg: ModelConfig | None = None,
                 threads: int = 1, batch_size: int = 64):
        set_torch_threads(threads)
        self.id = worker_identity("reward_model", rank, world_size)
        self.device = local_device()
        bf16 = self.device.type == "cuda" and (model_cfg or ModelConfig()).dtype == DType.BF16
        self.names, self.batch_size = list(models), batch_size
        self.tokenizers, self.models = [], []
        for path in models:
            tok = load_tokenizer(path)
            if not getattr(tok, "chat_template", None):
                raise ValueError(f"reward.models: {path} has no chat template: a reward model scores conversations "
                                 "rendered with its own template")
            rm = load_reward_model(path, device=self.device)
            self.tokenizers.append(tok)
            self.models.append(rm.to(torch.bfloat16) if bf16 else rm)

    def identity(self) -> WorkerId:
        return self.id

    def where(self) -> dict:
        return where()

    @torch.no_grad()
    def score(self, messages: list[list[dict]], completions: list[str]) -> tuple[list[list[float]], float]:
        t0 = time.perf_counter()
        conversations = [list(m) + [{"role": "assistant", "content": c}] for m, c in zip(messages, completions)]
        out = [score_conversations(rm, tok, conversations, batch_size=self.batch_size)
               for rm, tok in zip(self.models, self.tokenizers)]
        return out, time.perf_counter() - t0


class RewardModelGroup:
    """Fan-out over reward-model workers: length-balanced shards -> .remote -> gather -> merge in order. A
    scoring group (registry `scores=True`): `role`, `score` and `weighted` are what loops.common.score reads."""

    role = "reward_model"

    def __init__(self, workers: list, ids: list[WorkerId], timeout_s: float, models: list[str],
                 weights: list[float] | None = None):
        """`weights`: one per model (default 1.0 each), how `weighted` mixes their scores."""
        self.workers, self.ids, self.timeout_s, self.models = workers, ids, timeout_s, list(models)
        self.weights = list(weights) if weights else [1.0] * len(self.models)

    def identities(self) -> list[WorkerId]:
        return list(self.ids)

    def score(self, trajectories: Trajectories) -> Scores:
        t = trajectories
        lengths = [len(text) + sum(len(m.get("content") or "") for m in msgs)
                   for text, msgs in zip(t.texts, t.messages)]
        sh = dispatch.shard(list(range(len(lengths))), lengths, min(len(self.workers), len(lengths)))
        refs = [w.score.remote([t.messages[i] for i in idx], [t.texts[i] for i in idx])
                for w, idx in zip(self.workers, sh.indices)]
        res = gather(refs, self.ids[:len(refs)], stage="reward_model.score", timeout_s=self.timeout_s)
        per_model = [dispatch.merge(sh, [r[0][m] for r in res]) for m in range(len(self.models))]
        return Scores(policy_version=t.policy_version, names=[f"model{m}" for m in range(len(self.models))],
                      sources=self.models, scores=per_model, compute_s=max(r[1] for r in res))

    def weighted(self, scores: Scores) -> list[float]:
        """(B,) sum over models of weight x score."""
        return [sum(w * s[b] for w, s in zip(self.weights, scores.scores)) for b in range(len(scores.scores[0]))]
