"""Teacher-forced log-probs of response tokens without the whole (tokens x vocabulary) logits at once.

The output head is the largest activation of a policy update with a real vocabulary: one micro-batch of 4 x 64
response tokens of SmolLM2 (49,152 tokens) has 50 MB of fp32 logits, and the tempered copy, the log-softmax
and their gradients hold several more of that size until the backward ends. `response_logprobs` instead:

1. runs the model up to its final hidden states (the output head swapped for an identity during that forward,
   so DDP, FSDP2, gradient checkpointing and LoRA see the model's own forward), keeping only the response
   positions that exist (padding never reaches the head);
2. applies the head in chunks of rows inside one autograd function (`_HeadLogprobs`): each chunk's logits give
   the target's log-prob under the sampling distribution (temperature, then top-k / top-p truncation with the
   target always kept, renormalised - as `generate.sampling_logprobs`) and the entropy of the tempered,
   untruncated distribution (as `generate.entropy_from_logits`), and are freed; only the hidden states are
   kept for the backward;
3. in the backward recomputes one chunk's logits at a time and forms d logp / d logits = (onehot(target) - p) / T
   with p the truncated, renormalised probabilities (0 where cut), then the gradients of the hidden states and,
   when it trains, of the head's weight.

This is the fused linear + log-softmax of Liger's and Apple's cut-cross-entropy kernels, for the policy loss's
log-probs: peak memory holds one chunk's (rows, V) logits instead of the whole micro-batch's, at the price of
computing the head's matmul twice (forward and backward), as activation checkpointing would.

A model whose causal-LM forward does more than `lm_head(hidden)` (Gemma 2's logit soft-capping, Cohere's logit
scale) cannot be split there: `plain_head` checks that once per model on a tiny input, and such models take
the unchunked path (`generate.forward_response_logits`).
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.nn.functional as F

from posttrain.models.attention_bias import attention_bias
from posttrain.models.generate import (
    _truncation_mask,
    entropy_from_logits,
    forward_response_logits,
    keep_last,
    response_layout,
    sampling_logprobs,
)
from posttrain.models.prompt_sharing import shared_prompt_layout

CHUNK_ELEMENTS = 2 ** 21
"""Logits per chunk (rows x vocabulary): 8 MB in fp32, 42 rows of a 49k vocabulary."""

_PLAIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # DDP wraps the model as .module


@contextlib.contextmanager
def _head_off(model: torch.nn.Module):
    """The model's output head replaced by an identity: its forward returns the final hidden states."""
    inner = _inner(model)
    head = inner.get_output_embeddings()
    inner.set_output_embeddings(torch.nn.Identity())
    try:
        yield head
    finally:
        inner.set_output_embeddings(head)


@torch.no_grad()
def plain_head(model: torch.nn.Module) -> bool:
    """Whether the model's logits are exactly its head applied to what its forward computes with the head off
    (checked once per model object, on 3 tokens, in eval mode so dropout cannot differ, and without autocast)."""
    inner = _inner(model)
    if inner not in _PLAIN:
        head = inner.get_output_embeddings()
        if not isinstance(head, torch.nn.Linear):
            _PLAIN[inner] = False
            return False
        training = inner.training
        inner.eval()
        device = head.weight.device
        try:  # in fp32 even when called under autocast: the check is about the forward's structure
            with torch.autocast(device.type, enabled=False):
                ids = torch.tensor([[1, 2, 3]], device=device)
                logits = inner(input_ids=ids, use_cache=False).logits.float()
                with _head_off(inner):
                    hidden = inner(input_ids=ids, use_cache=False).logits
                _PLAIN[inner] = (hidden.shape[-1] == head.in_features
                                 and torch.allclose(head(hidden).float(), logits, rtol=1e-4, atol=1e-4))
        finally:
            inner.train(training)
    return _PLAIN[inner]


class _HeadLogprobs(torch.autograd.Function):
    """(N, H) hidden states, the head's weight (V, H) and bias, (N,) targets -> (N,) log-probs of the targets
    under the sampling distribution, (N,) entropies (no gradient). See the module docstring."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, hidden, weight, bias, targets, temperature: float, top_p: float, top_k: int, rows: int):
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        ent = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for s in range(0, n, rows):
            x = F.linear(hidden[s:s + rows], weight, bias).float() / temperature  # (rows, V)
            full = torch.logsumexp(x, -1)
            ent[s:s + rows] = full - (torch.softmax(x, -1) * x).sum(-1)
            cut = _truncation_mask(x, top_p, top_k, targets[s:s + rows])
            lse = full if cut is None else torch.logsumexp(x.masked_fill(cut, float("-inf")), -1)
            logp[s:s + rows] = x.gather(-1, targets[s:s + rows, None]).squeeze(-1) - lse
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.settings = (temperature, top_p, top_k, rows)
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_logp, _grad_ent):
        hidden, weight, bias, targets = ctx.saved_tensors
        temperature, top_p, top_k, rows = ctx.settings
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None and ctx.needs_input_grad[2] else None
        for s in range(0, hidden.shape[0], rows):
            h = hidden[s:s + rows]
            x = F.linear(h, weight, bias).float() / temperature
            cut = _truncation_mask(x, top_p, top_k, targets[s:s + rows])
            if cut is not None:
                x = x.masked_fill(cut, float("-inf"))
            g = grad_logp[s:s + rows].float()
            d = torch.softmax(x, -1).mul_(-g[:, None])  # d logp / d x = onehot - p, times the incoming gradient
            d.scatter_add_(-1, targets[s:s + rows, None], g[:, None])
            d.div_(temperature)  # x = logits / T
            if grad_hidden is not None:
                grad_hidden[s:s + rows] = (d.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += d.t() @ h.float()
            if grad_bias is not None:
                grad_bias += d.sum(0)
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None, None, None)


def response_logprobs(model, prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int, *,
                      temperature: float, top_p: float = 1.0, top_k: int = 0, share_prompt: bool = True
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log-probs (B, R) fp32, entropies (B, R) fp32 without gradient, mask (B, R) bool) of each response token
    under the model's sampling distribution, R the longest response; 0 where the mask is False.
    Differentiable in the model's parameters when grad is enabled. Same values as `forward_response_logits`
    followed by `sampling_logprobs` and `entropy_from_logits`, with the head applied in chunks. With
    `share_prompt`, rows that repeat a prompt are laid out with it once (`prompt_sharing`); same values, float
    rounding aside."""
    if not plain_head(model):
        logits, targets, mask = forward_response_logits(model, prompt_ids, response_ids, pad_id)
        logp = sampling_logprobs(logits, targets, temperature, top_p, top_k) * mask
        with torch.no_grad():
            ent = entropy_from_logits(logits, temperature) * mask
        return logp, ent, mask
    device = next(model.parameters()).device
    lay = shared_prompt_layout(prompt_ids, response_ids, pad_id) if share_prompt else None
    if lay is not None:  # some prompt's responses share a row
        mask, targets = lay.mask.to(device), lay.targets.to(device)
        with _head_off(model) as head:
            hidden = model(input_ids=lay.input_ids.to(device),
                           attention_mask=attention_bias(lay.attention_mask, model, device),
                           position_ids=lay.position_ids.to(device), use_cache=False).logits  # (G, T, H)
        hidden = hidden.reshape(-1, hidden.shape[-1])[lay.read.to(device)]  # (N, H), a prompt's last row repeated
    else:
        ids, att, pos, targets, mask, R = response_layout(prompt_ids, response_ids, pad_id)
        mask = mask.to(device)
        targets = targets.to(device)[mask]
        with _head_off(model) as head:
            hidden = model(input_ids=ids.to(device), attention_mask=att.to(device), position_ids=pos.to(device),
                           use_cache=False, **keep_last(model, R)).logits[:, -R:][mask]  # (N, H)
    rows = max(1, CHUNK_ELEMENTS // head.out_features)
    flat_logp, flat_ent = _HeadLogprobs.apply(hidden, head.weight, head.bias, targets, temperature,
                                              top_p, top_k, rows)
    logp = torch.zeros(mask.shape, dtype=torch.float32, device=device).masked_scatter(mask, flat_logp)
    ent = torch.zeros(mask.shape, dtype=torch.float32, device=device).masked_scatter(mask, flat_ent)
    return logp, ent, mask


@torch.no_grad()
def sequence_logprobs(model, prompt_ids: list[list[int]], response_ids: list[list[int]], *, temperature: float,
                      batch_size: int = 256, pad_id: int, top_p: float = 1.0, top_k: int = 0,
                      share_prompt: bool = True) -> list[torch.Tensor]:
    """Per-token log-probs of each response under the model's sampling distribution (`sampling_logprobs` at
    temperature / top_p / top_k), one fp32 CPU tensor per row; the output head in chunks
    (`response_logprobs`), so no (rows x R x vocabulary) logits exist at once."""

    out = []
    for s in range(0, len(prompt_ids), batch_size):
        lp = response_logprobs(model, prompt_ids[s:s + batch_size], response_ids[s:s + batch_size], pad_id,
                               temperature=temperature, top_p=top_p, top_k=top_k,
                               share_prompt=share_prompt)[0].cpu()
        for i, r in enumerate(response_ids[s:s + batch_size]):
            out.append(lp[i, :len(r)])
    return out
