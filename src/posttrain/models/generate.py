"""Batched generation with a KV cache and exact per-token log-probs; the same log-probs teacher-forced.

One explicit decoding loop (left padding under an attention mask, DynamicCache) serves evaluation and the RL
rollout role. A row stops at the first of ANY of its stop ids (`eos_id`: one id or a list - instruct models
often have several, see posttrain.models.io.eos_token_ids). Equal prompts in a batch (a prompt's n samples)
are run through the model once: their rows decode from copies of that prompt's KV cache, so the prefill costs
one forward per distinct prompt, not per sample.

Sampling distribution: logits / temperature, then top-k (keep the k largest; ties at the k-th value are
kept), then top-p on the top-k-renormalised distribution (keep the smallest prefix of the sorted tokens whose
probability reaches top_p; the most likely token always stays), then renormalise - the order of HF's
TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper. The log-prob recorded for each sampled
token is its log-prob under THAT truncated, renormalised distribution, i.e. the distribution actually
sampled from. `sampling_logprobs` is the one function that computes it, for the sampler and for the
teacher-forced side (`sequence_logprobs`, the policy's update and the reference), so the rollout/policy
drift check and the importance ratio compare like with like (tested at 1e-4 in fp32).

Teacher-forced, the truncation set is computed from the scoring model's own logits and the target token is
always kept in it: a token sampled by the rollout can fall just outside the policy's top-p set after an
update, in another precision (bf16 rollout, fp32 policy), or under the reference model's weights; keeping it
gives a finite log-prob (of the renormalised set plus that token) instead of -inf. When the target is inside
the set - always for the sampler itself - nothing changes.

Greedy decoding (temperature 0) records log_softmax(logits) at temperature 1 and ignores top-k/top-p (they
cannot change the argmax).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Protocol

import torch
from transformers import DynamicCache


@dataclass(frozen=True)
class Generation:
    prompt_ids: list[int]
    response_ids: list[int]
    """Generated tokens, including the EOS token when the sample finished."""
    logprobs: list[float]
    """Per response token: the chosen token's log-prob under the distribution it was sampled from
    (`sampling_logprobs`: temperature, top-k, top-p, renormalised); log_softmax(logits) if greedy."""
    finished: bool


class Sampler(Protocol):
    """What samples from a model: the rollout engines of posttrain.rl.roles.rollout (with weight loading on top),
    the evaluated model of posttrain.eval.episodes; multi-turn episodes (posttrain.envs.episodes.run_episodes)
    drive any of them. `tokenizer` decodes the responses."""

    tokenizer: object

    def generate(self, prompts: list[list[int]], *, n: int, temperature: float, max_new_tokens: int,
                 seed: int, top_p: float = 1.0, top_k: int = 0) -> list[Generation]:
        """n samples per prompt (prompt-major), each stopped at any of the model's EOS ids. Every token's
        log-prob is that of the distribution it was sampled from (temperature, top_k, top_p, renormalised:
        sampling_logprobs), which the policy's drift check recomputes."""
        ...


def _truncation_mask(logits: torch.Tensor, top_p: float, top_k: int,
                     keep: torch.Tensor | None = None) -> torch.Tensor | None:
    """(N, V) tempered logits -> (N, V) bool, True where a token is cut by top-k / top-p (None: nothing cut).
    `keep` (N,) token ids that are never cut."""
    V = logits.shape[-1]
    cut = None
    if 0 < top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (N, 1)
        cut = logits < kth
    if top_p < 1.0:
        x = logits if cut is None else logits.masked_fill(cut, float("-inf"))
        probs, order = torch.softmax(x, dim=-1).sort(dim=-1, descending=True)  # (N, V)
        mass_before = probs.cumsum(-1) - probs  # probability of the tokens ranked above
        cut_sorted = mass_before >= top_p  # the first token has 0 before it: always kept
        cut_p = torch.zeros_like(cut_sorted).scatter(-1, order, cut_sorted)
        cut = cut_p if cut is None else cut | cut_p
    if cut is not None and keep is not None:
        cut = cut.scatter(-1, keep[:, None], False)
    return cut


def sampling_logprobs(logits: torch.Tensor, targets: torch.Tensor | None, temperature: float, top_p: float = 1.0,
                      top_k: int = 0, *, chunk_rows: int = 1024) -> torch.Tensor:
    """Log-probs under the sampling distribution: softmax of logits / temperature after top-k and top-p
    truncation, renormalised over the kept tokens.

    (..., V) logits, (...) targets -> (...) log-probs of the targets; the target is never truncated away.
    With `targets` None: (..., V) the whole truncated log-distribution (-inf where cut), as the sampler uses.
    Differentiable in `logits` (the truncation set itself is a constant); the sort that top-p needs runs
    without grad in chunks of `chunk_rows` rows."""
    shape = logits.shape
    x = logits.float().reshape(-1, shape[-1]) / temperature  # (N, V)
    tgt = targets.reshape(-1) if targets is not None else None
    if top_p < 1.0 or 0 < top_k < shape[-1]:
        with torch.no_grad():
            parts = [_truncation_mask(x[i:i + chunk_rows], top_p, top_k,
                                      tgt[i:i + chunk_rows] if tgt is not None else None)
                     for i in range(0, x.shape[0], chunk_rows)]
        x = x.masked_fill(torch.cat(parts), float("-inf"))
    logp = torch.log_softmax(x, dim=-1)
    if tgt is None:
        return logp.reshape(shape)
    return logp.gather(-1, tgt[:, None]).squeeze(-1).reshape(shape[:-1])


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """(..., V) logits, (...) targets -> (...) log-probs of the targets at `temperature`, no truncation."""
    return sampling_logprobs(logits, targets, temperature)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """(..., V) -> (...) entropy of softmax(logits / temperature)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


@torch.no_grad()
def generate(model, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, n: int = 1,
             eos_id: int | list[int], pad_id: int, seed: int = 0, batch_size: int = 256, top_p: float = 1.0,
             top_k: int = 0, on_batch: Callable[[int, int], None] | None = None) -> list[Generation]:
    """n samples per prompt (prompt-major order); temperature 0 means greedy. A row stops at any id in
    `eos_id`; top_p < 1 / top_k > 0 truncate the sampling distribution (see the module docstring).
    `on_batch(rows done, rows)` is called after each batch (progress)."""
    if not 0.0 < top_p <= 1.0 or top_k < 0:
        raise ValueError(f"generate: top_p must be in (0, 1] and top_k >= 0, got top_p={top_p}, top_k={top_k}")
    stop = [eos_id] if isinstance(eos_id, int) else list(eos_id)
    if not stop:
        raise ValueError("generate: eos_id is empty; give at least one stop token id")
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = [p for p in prompts for _ in range(n)]
    sampling = _Sampling(temperature, top_p, top_k, torch.tensor(stop, device=device))
    out: list[Generation] = []
    for s in range(0, len(rows), batch_size):
        out.extend(_generate_batch(model, rows[s:s + batch_size], max_new_tokens, sampling, pad_id, gen, device))
        if on_batch is not None:
            on_batch(len(out), len(rows))
    return out


@dataclass(frozen=True)
class _Sampling:
    temperature: float
    top_p: float
    top_k: int
    stop: torch.Tensor  # (S,) stop token ids on the model's device


def _generate_batch(model, prompts, max_new_tokens, sp: _Sampling, pad_id, gen, device) -> list[Generation]:
    B, P = len(prompts), max(len(p) for p in prompts)
    distinct, row_of = distinct_rows(prompts)
    ids = torch.full((len(distinct), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(distinct), P), dtype=torch.long)
    for i, p in enumerate(distinct):  # left padding: every row's next token is at column P
        ids[i, P - len(p):] = torch.tensor(p)
        mask[i, P - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # (distinct prompts, P)
    cache = DynamicCache()
    last = {"logits_to_keep": 1} if _takes_logits_to_keep(model) else {}  # the prompt's other logits are unused
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                   use_cache=True, **last).logits[:, -1]  # (distinct prompts, V)
    if len(distinct) < B:  # each prompt went through the model once; its n samples decode from copies of its cache
        index = torch.tensor(row_of, device=device)
        cache.reorder_cache(index)
        logits, mask, pos = logits[index], mask[index], pos[index]
    next_pos = pos[:, -1:] + 1
    tokens, logps = [], []
    done = torch.zeros(B, dtype=torch.bool, device=device)
    finished_at = torch.full((B,), -1, dtype=torch.long)
    for t in range(max_new_tokens):
        if sp.temperature > 0:
            logp = sampling_logprobs(logits, None, sp.temperature, sp.top_p, sp.top_k)  # (B, V), -inf where cut
            tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
        else:
            logp = torch.log_softmax(logits.float(), dim=-1)
            tok = logp.argmax(-1)
        tokens.append(tok)
        logps.append(logp.gather(-1, tok[:, None]).squeeze(-1))
        newly = torch.isin(tok, sp.stop) & ~done
        finished_at[newly.cpu()] = t
        done |= newly
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=device)], dim=1)
        logits = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, past_key_values=cache,
                       use_cache=True).logits[:, -1]
        next_pos = next_pos + 1
    toks = torch.stack(tokens, 1).cpu()  # (B, steps)
    lps = torch.stack(logps, 1).cpu()
    res = []
    for i in range(B):
        end = int(finished_at[i]) + 1 if finished_at[i] >= 0 else toks.shape[1]
        res.append(Generation(prompt_ids=list(prompts[i]), response_ids=toks[i, :end].tolist(),
                              logprobs=lps[i, :end].tolist(), finished=bool(finished_at[i] >= 0)))
    return res


def distinct_rows(rows: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """(the distinct rows in first-seen order, each row's index among them): the n samples of a prompt are n equal
    rows, which need the model's forward over the prompt once."""
    first: dict[tuple[int, ...], int] = {}
    row_of = [first.setdefault(tuple(r), len(first)) for r in rows]
    return [list(k) for k in first], row_of


def response_layout(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int):
    """The teacher-forced batch of `forward_response_logits` (see there), on the CPU: (input ids, attention mask,
    position ids, targets (B, R), mask (B, R), R)."""
    B = len(prompt_ids)
    P = max(len(p) for p in prompt_ids)
    R = max(max(len(r) for r in response_ids), 1)
    ids = torch.full((B, P + R - 1), pad_id, dtype=torch.long)
    att = torch.zeros((B, P + R - 1), dtype=torch.long)
    targets = torch.full((B, R), pad_id, dtype=torch.long)
    rmask = torch.zeros((B, R), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        seq = (p + r)[: len(p) + R - 1]
        ids[i, P - len(p): P - len(p) + len(seq)] = torch.tensor(seq)
        att[i, P - len(p): P - len(p) + len(seq)] = 1
        targets[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        rmask[i, :len(r)] = True
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    return ids, att, pos, targets, rmask, R


def forward_response_logits(model, prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int):
    """Teacher-forced logits for each response token. Returns (logits (B, R, V), targets (B, R), mask (B, R))
    with R the longest response; the mask comes from lengths, never from token ids.

    Layout: prompts left-padded so every response starts at the same column P, responses right-padded to R,
    position ids counting real tokens only (as `generate` lays out its batch). The logits predicting the
    response tokens are then the last R columns of the input for every row, so the model is asked for those
    alone (`logits_to_keep`): the output projection runs on R positions instead of P + R - with a 49k-token
    vocabulary and ~190-token prompts that is 4x less logits memory and ~15 % less compute in the policy's
    forward and backward. The last response column is never an input (it is only a target).
    (`head_logprobs.response_logprobs` goes further: the head in chunks, on real response tokens only.)"""
    device = next(model.parameters()).device
    ids, att, pos, targets, rmask, R = response_layout(prompt_ids, response_ids, pad_id)
    # use_cache=False: a training-mode forward would otherwise build a KV cache nobody reads
    logits = model(input_ids=ids.to(device), attention_mask=att.to(device), position_ids=pos.to(device),
                   use_cache=False, **keep_last(model, R)).logits[:, -R:]  # (B, R, V)
    return logits, targets.to(device), rmask.to(device)


def keep_last(model, R: int) -> dict:
    """The forward's keyword asking for the last R positions' outputs only, where the model takes it."""
    return {"logits_to_keep": R} if _takes_logits_to_keep(model) else {}


def _takes_logits_to_keep(model) -> bool:
    """Whether the model's forward accepts `logits_to_keep` (HF causal LMs do; DDP wraps the model as .module)."""
    return _forward_takes_logits_to_keep(type(getattr(model, "module", model)))


@cache
def _forward_takes_logits_to_keep(cls: type) -> bool:
    """Read once per model class: this runs on every micro-batch and every generation batch."""
    return "logits_to_keep" in inspect.signature(cls.forward).parameters
