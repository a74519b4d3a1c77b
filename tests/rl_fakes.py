"""In-process role groups over a tiny real torch model, for tests and for reading the controller.

Nothing here is a mock of behaviour we claim: a bigram language model (one (V, V) logit table) really
samples tokens at a temperature and reports their exact log-probs, the policy really takes clipped-ratio
GRPO steps with AdamW, the reference really is a frozen copy, and weight sync really copies tensors and
reports a checksum computed from what the receiver holds. What is fake is the scale and the transport
(plain method calls instead of Ray), which is what lets `Controller` be tested in milliseconds.

Faulty variants for the controller's safety checks:
- `StaleRolloutGroup` reports the handle's version but keeps the previous step's weights (its checksum
  is honest, so verify_reports names it);
- `LowPrecisionRolloutGroup` holds the right weights but samples from a rounded copy (drift check).
`local_reward_group(reward_cfg)` is not a fake: the real reward role and sandbox, called in-process.

The toy task: a prompt is a list of token ids; the answer is the token the response must start with.

    groups = make_fake_groups(rl_cfg); sampler = fake_sampler(rl_cfg)
    Controller(rl_cfg, groups, sampler, NullTracker(), checkpointer=None).run(3)
"""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path

import torch

from posttrain.config import RewardConfig, RLConfig
from posttrain.rl.algorithms.grpo import policy_loss
from posttrain.rl.remote import LocalActor
from posttrain.rl.roles.registry import uses_reference
from posttrain.rl.roles.reward import RewardGroup, RewardWorker
from posttrain.rl.state import PromptSampler
from posttrain.rl.types import (
    LogProbs,
    ModelPut,
    PromptBatch,
    Rewards,
    TrainBatch,
    Trajectories,
    UpdateStats,
    WeightReport,
    WeightsHandle,
    WorkerId,
)
from posttrain.rl.weight_sync import weights_checksum

VOCAB, EOS = 12, 0


class BigramLM(torch.nn.Module):
    """logits(next | prev) = table[prev]: the smallest autoregressive LM with real sampling and gradients."""

    def __init__(self, vocab: int = VOCAB, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g) * 0.1)

    def response_logprobs(self, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
        prev = torch.tensor([prompt[-1]] + response[:-1])  # (R,)
        logp = torch.log_softmax(self.table[prev] / temperature, dim=-1)  # (R, V)
        return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)  # (R,)

    @torch.no_grad()
    def sample(self, prompt: list[int], temperature: float, max_new_tokens: int, gen: torch.Generator):
        prev, out, lps = prompt[-1], [], []
        for _ in range(max_new_tokens):
            logp = torch.log_softmax(self.table[prev] / temperature, dim=-1)
            tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            out.append(tok)
            lps.append(float(logp[tok]))
            if tok == EOS:
                break
            prev = tok
        return out, lps


def _ident(role: str, rank: int = 0, world: int = 1) -> WorkerId:
    return WorkerId(role=role, rank=rank, world_size=world, node=socket.gethostname(), pid=os.getpid())


def _pad(rows) -> torch.Tensor:
    """Ragged rows (lists or 1-D tensors) -> (B, R) right-padded with 0 (gradients flow through tensors)."""
    R = max(max(len(r) for r in rows), 1)
    return torch.stack([torch.cat([torch.as_tensor(r, dtype=torch.float32),
                                   torch.zeros(R - len(r))]) for r in rows])


def _clone(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class FakeRolloutGroup:
    def __init__(self, weights: dict[str, torch.Tensor]):
        self.model, self.version = BigramLM(), -1
        self.model.load_state_dict(weights)

    def identities(self) -> list[WorkerId]:
        return [_ident("rollout")]

    def _sampling_model(self) -> BigramLM:
        return self.model

    def generate(self, prompts: PromptBatch, *, n: int, temperature: float, max_new_tokens: int,
                 seed: int, top_p: float = 1.0, top_k: int = 0) -> Trajectories:
        if top_p != 1.0 or top_k != 0:
            raise ValueError("the fake rollout samples the full distribution: top_p must be 1.0 and top_k 0")
        gen, model = torch.Generator().manual_seed(seed), self._sampling_model()
        rows = [(i, p) for i, p in enumerate(prompts.prompt_ids) for _ in range(n)]
        samples = [model.sample(p, temperature, max_new_tokens, gen) for _, p in rows]
        return Trajectories(
            policy_version=self.version, group_index=[i for i, _ in rows], prompt_ids=[p for _, p in rows],
            response_ids=[s[0] for s in samples], logprobs=[s[1] for s in samples],
            finished=[s[0][-1] == EOS for s in samples], texts=[" ".join(map(str, s[0])) for s in samples],
            answers=[prompts.answers[i] for i, _ in rows], tasks=[prompts.tasks[i] for i, _ in rows],
            messages=[prompts.messages[i] for i, _ in rows], columns=[prompts.columns[i] for i, _ in rows],
            compute_s=0.0)

    def _hold(self, handle: WeightsHandle) -> None:
        self.model.load_state_dict(handle.payload)

    def load_weights(self, weights: WeightsHandle) -> list[WeightReport]:
        self._hold(weights)
        self.version = weights.version
        return [WeightReport(worker=self.identities()[0], version=weights.version,
                             checksum=weights_checksum(self.model.state_dict()))]


class StaleRolloutGroup(FakeRolloutGroup):
    """Claims each new version but keeps the weights of the previous sync (a dropped or late transfer)."""

    def __init__(self, weights):
        super().__init__(weights)
        self._previous: dict[str, torch.Tensor] | None = None

    def _hold(self, handle: WeightsHandle) -> None:
        self.model.load_state_dict(self._previous if self._previous is not None else handle.payload)
        self._previous = {k: v.clone() for k, v in handle.payload.items()}


class LowPrecisionRolloutGroup(FakeRolloutGroup):
    """Holds the right weights (checksum passes) but samples from a coarsely rounded copy of them."""

    def _sampling_model(self) -> BigramLM:
        rounded = BigramLM()
        rounded.load_state_dict({k: (v * 2).round() / 2 for k, v in self.model.state_dict().items()})
        return rounded


class FakeRewardGroup:
    """Score 1 when the response starts with the answer token. `fail_prompt_token` makes the scoring
    function raise for prompts ending in that token: the group records the failure and scores 0."""

    weight = 1.0  # reward.fn_weight

    def __init__(self, fail_prompt_token: int | None = None):
        self.fail_prompt_token = fail_prompt_token

    def identities(self) -> list[WorkerId]:
        return [_ident("reward")]

    def check_arguments(self, columns: list[str]) -> None:
        pass  # its scoring function needs only the prompt tokens, the response and the answer

    def _score_one(self, prompt: list[int], response: list[int], answer: str | None) -> float:
        if prompt[-1] == self.fail_prompt_token:
            raise ValueError(f"cannot score prompt ending in {prompt[-1]}")
        return float(bool(response) and answer is not None and response[0] == int(answer))

    def score(self, trajectories: Trajectories) -> Rewards:
        scores, failures = [], []
        for p, r, a in zip(trajectories.prompt_ids, trajectories.response_ids, trajectories.answers):
            try:
                scores.append(self._score_one(p, r, a))
                failures.append(None)
            except Exception as e:  # noqa: BLE001 - a user reward function may raise anything
                scores.append(0.0)
                failures.append(f"{type(e).__name__}: {e}")
        return Rewards(policy_version=trajectories.policy_version, scores=scores, failures=failures,
                       scorer="tests.rl_fakes:FakeRewardGroup", compute_s=0.0)


def local_reward_group(reward_cfg: RewardConfig, workers: int = 1) -> RewardGroup:
    """The real reward role (RewardGroup over RewardWorkers, i.e. the real sandboxed scorer) with plain
    method calls instead of Ray: the texts it scores are the fake responses, space-separated token ids."""
    ws = [RewardWorker(reward_cfg, rank, workers) for rank in range(workers)]
    return RewardGroup([LocalActor(w) for w in ws], [w.identity() for w in ws], timeout_s=60.0)


class FakeReferenceGroup:
    def __init__(self, weights: dict[str, torch.Tensor]):
        self.model = BigramLM()
        self.model.load_state_dict(weights)

    def identities(self) -> list[WorkerId]:
        return [_ident("reference")]

    @torch.no_grad()
    def log_probs(self, trajectories: Trajectories, *, temperature: float) -> LogProbs:
        vals = [self.model.response_logprobs(p, r, temperature).tolist()
                for p, r in zip(trajectories.prompt_ids, trajectories.response_ids)]
        return LogProbs(policy_version=trajectories.policy_version, values=vals, compute_s=0.0)


class FakePolicyGroup:
    """One in-process rank; the real GRPO loss (posttrain.rl.algorithms.grpo.policy_loss) with AdamW."""

    def __init__(self, weights: dict[str, torch.Tensor], cfg: RLConfig):
        self.cfg, self.model, self.version = cfg, BigramLM(), 0
        self.model.load_state_dict(weights)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.kept = {0: _clone(self.model)}
        """Weights of the last rl.max_staleness + 1 versions, as the real policy keeps them: the drift gate of a
        row generated ahead is at its own version."""

    def identities(self) -> list[WorkerId]:
        return [_ident("policy")]

    def _drift(self, batch: TrainBatch, logp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> float:
        if batch.versions is None:  # like the real policy: the first forward at the batch's version measures drift
            return float(((logp.detach() - old).abs() * mask).sum() / mask.sum())
        for i, v in enumerate(batch.versions):
            if not 0 <= self.version - v <= self.cfg.max_staleness:
                raise RuntimeError(f"row {i} generated by version {v}, policy at {self.version}: beyond the bound")
        at_version = BigramLM()
        rows = []
        for v, p, r in zip(batch.versions, batch.prompt_ids, batch.response_ids):
            at_version.load_state_dict(self.kept[v])
            with torch.no_grad():
                rows.append(at_version.response_logprobs(p, r, self.cfg.temperature))
        return float(((_pad(rows) - old).abs() * mask).sum() / mask.sum())

    def update(self, batch: TrainBatch, *, drift_threshold: float = math.inf) -> UpdateStats:
        if batch.policy_version != self.version:
            raise RuntimeError(f"policy holds version {self.version}, batch was made for {batch.policy_version}")
        c, T = self.cfg, self.cfg.temperature
        old, mask = _pad(batch.old_logprobs), _pad([[1.0] * len(r) for r in batch.response_ids])  # (B, R)
        ref = _pad(batch.ref_logprobs) if batch.ref_logprobs is not None else None
        adv = torch.tensor(batch.advantages)  # (B,)
        drift = math.nan
        for epoch in range(c.inner_epochs):
            logp = _pad([self.model.response_logprobs(p, r, T) for p, r in zip(batch.prompt_ids, batch.response_ids)])
            if epoch == 0:
                drift = self._drift(batch, logp, old, mask)
                if not drift <= drift_threshold:
                    return self._stats(0.0, None, math.nan, drift, applied=False, stopped=f"drift {drift:.4g}")
            loss, st = policy_loss(logp, old, adv, mask, clip_low=c.clip_low, clip_high=c.clip_high,
                                   loss_agg=c.loss_agg, ref_logp=ref, kl_coef=c.kl_coef, kl_estimator=c.kl_estimator)
            self.opt.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.max_grad_norm or 1e9)
            self.opt.step()
        self.version += 1
        self.kept[self.version] = _clone(self.model)
        self.kept = {v: w for v, w in self.kept.items() if v >= self.version - c.max_staleness}
        return self._stats(float(loss.detach()), st, float(grad_norm), drift)

    def _stats(self, loss: float, st, grad_norm: float, drift: float, *, applied: bool = True,
               stopped: str = "") -> UpdateStats:
        with torch.no_grad():
            probs = torch.softmax(self.model.table / self.cfg.temperature, -1)
            entropy = float(-(probs * probs.log()).sum(-1).mean())
        return UpdateStats(policy_version=self.version, loss=loss, pg_loss=st.pg_loss if st else 0.0,
                           kl=st.kl if st else 0.0, entropy=entropy, clip_fraction=st.clip_fraction if st else 0.0,
                           grad_norm=grad_norm, weights_checksum=weights_checksum(self.model.state_dict()),
                           drift=drift, applied=applied, stopped=stopped, compute_s=0.0)

    def weights(self) -> WeightsHandle:
        w = _clone(self.model)
        return WeightsHandle(version=self.version, checksum=weights_checksum(w), payload=w)

    def save_model(self, put: ModelPut) -> str:
        import tempfile

        from safetensors.torch import save_file

        from posttrain.artifacts import ArtifactStore

        with tempfile.TemporaryDirectory() as out_dir:
            save_file(_clone(self.model), str(Path(out_dir) / "model.safetensors"))
            (Path(out_dir) / "config.json").write_text(json.dumps({"model_type": "bigram", "vocab_size": VOCAB}))
            (Path(out_dir) / "posttrain_rl.json").write_text(json.dumps(put.provenance, sort_keys=True))
            return ArtifactStore(put.store_root).put("model", put.name, out_dir, run_id=put.run_id,
                                                     parents=put.parents, config=put.config, metrics=put.metrics,
                                                     extra=put.extra).id

    def save_state(self, state_dir: str) -> None:
        from posttrain.artifacts.state import write_file

        write_file(f"{state_dir}/rank0.pt", lambda p: torch.save(
            {"model": self.model.state_dict(), "optim": self.opt.state_dict(), "version": self.version,
             "rng": torch.get_rng_state(), "kept": self.kept}, p))

    def load_state(self, state_dir: str) -> int:
        from posttrain.artifacts.state import read_file

        s = read_file(f"{state_dir}/rank0.pt", lambda p: torch.load(p, weights_only=True))
        self.model.load_state_dict(s["model"])
        self.opt.load_state_dict(s["optim"])
        torch.set_rng_state(s["rng"])
        self.version, self.kept = s["version"], s["kept"]
        return self.version


# --------------------------------------------------------------------------------------------- wiring


class FakeTokenizer:
    """Just enough of a HF tokenizer for encode_prompt: the 'chat template' is the user text itself,
    a space-separated list of token ids."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return " ".join(m["content"] for m in messages)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(t) for t in text.split()]}


def fake_examples(num: int = 64, seed: int = 0) -> list[dict]:
    """Prompts of 2 random non-EOS tokens; the answer is (last token + 1) mod VOCAB, never EOS."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        a, b = (int(x) for x in torch.randint(1, VOCAB, (2,), generator=g))
        out.append({"messages": [{"role": "user", "content": f"{a} {b}"}], "answer": str(b % (VOCAB - 1) + 1),
                    "task": "fake"})
    return out


def fake_sampler(cfg: RLConfig, num_examples: int = 64) -> PromptSampler:
    return PromptSampler(fake_examples(num_examples, cfg.seed), FakeTokenizer(), prompts_per_step=cfg.prompts_per_step,
                         seed=cfg.seed)


def make_fake_groups(cfg: RLConfig, *, rollout_cls: type = FakeRolloutGroup, reward=None,
                     seed: int = 0) -> dict:
    start = _clone(BigramLM(seed=seed))
    groups = {"rollout": rollout_cls(start), "reward": reward or FakeRewardGroup(),
              "reference": FakeReferenceGroup(start), "policy": FakePolicyGroup(start, cfg)}
    if not uses_reference(cfg):
        del groups["reference"]
    return groups


class NullTracker:
    """Keeps the StepMetrics it is given (tests read them)."""

    def __init__(self):
        self.logged: list = []

    def log(self, m) -> None:
        self.logged.append(m)

    def close(self, model_id: str | None = None, *, failed: bool = False) -> None:
        pass
