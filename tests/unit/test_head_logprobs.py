"""The policy's log-probs with the output head in chunks (posttrain.models.head_logprobs) against the whole-logits
path they replace (`forward_response_logits` + `sampling_logprobs` + `entropy_from_logits`): the same log-probs,
entropies and parameter gradients - full fine-tuning with a tied and an untied head, LoRA adapters, top-k/top-p
truncation, many chunks - while the backward keeps no (tokens x vocabulary) tensor; a model whose logits are not
just its head (soft-capping) takes the whole-logits path."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

from posttrain.config import LoraConfig
from posttrain.models import head_logprobs
from posttrain.models.generate import entropy_from_logits, forward_response_logits, sampling_logprobs
from posttrain.models.head_logprobs import plain_head, response_logprobs
from posttrain.models.lora import add_adapters

V = 512
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
RESPONSES = [[20, 21, 22], [23, 24, 25, 26, 27], [28]]


def _llama(tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=tied,
                                        pad_token_id=0))


def _whole(model, temperature, top_p, top_k):
    logits, targets, mask = forward_response_logits(model, PROMPTS, RESPONSES, 0)
    logp = sampling_logprobs(logits, targets, temperature, top_p, top_k)
    return logp, entropy_from_logits(logits.detach(), temperature), mask


def _grads(model, logp, mask, weights):
    model.zero_grad(set_to_none=True)
    (logp * weights * mask).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tied, lora", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("temperature, top_p, top_k", [(1.0, 1.0, 0), (0.7, 0.9, 40)])
def test_chunked_head_gives_the_whole_logits_values_and_gradients(monkeypatch, tied, lora, temperature, top_p, top_k):
    model = _llama(tied)
    if lora:
        add_adapters(model, LoraConfig(rank=4, alpha=8.0), seed=0)
        for n, p in model.named_parameters():  # B = 0 at the start would hide the adapters' gradient path
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.1)
    monkeypatch.setattr(head_logprobs, "CHUNK_ELEMENTS", 3 * V)  # 3 rows a chunk: 4 chunks of 9 tokens
    weights = torch.randn(3, 5)
    want_logp, want_ent, mask = _whole(model, temperature, top_p, top_k)
    want = _grads(model, want_logp, mask, weights)
    logp, ent, got_mask = response_logprobs(model, PROMPTS, RESPONSES, 0, temperature=temperature, top_p=top_p,
                                            top_k=top_k)
    got = _grads(model, logp, got_mask, weights)
    assert plain_head(model) and torch.equal(mask, got_mask)
    assert torch.allclose(logp[mask], want_logp[mask], atol=1e-5)
    assert torch.allclose(ent[mask], want_ent[mask], atol=1e-5) and not ent.requires_grad
    assert (logp[~mask] == 0).all() and (ent[~mask] == 0).all()
    assert set(got) == set(want) and (not lora or all("lora_" in n for n in got))
    if tied and not lora:
        assert "model.embed_tokens.weight" in got  # the tied head's weight trains through the chunks too
    for n in want:
        assert torch.allclose(got[n], want[n], atol=1e-5, rtol=1e-4), n


def test_the_backward_keeps_no_vocabulary_sized_tensor():
    """What autograd saves for the backward: the whole-logits path keeps (tokens x V) tensors, the chunked head
    keeps none (only the hidden states of the response tokens, and the head's weight, which the model holds)."""
    model = _llama(tied=True)

    def largest_saved(fn) -> int:
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            fn()
        return max(n for n in sizes if n != model.lm_head.weight.numel())

    tokens = sum(len(r) for r in RESPONSES)
    assert largest_saved(lambda: _whole(model, 1.0, 1.0, 0)) >= tokens * V
    assert largest_saved(lambda: response_logprobs(model, PROMPTS, RESPONSES, 0, temperature=1.0)) < tokens * V


def test_a_model_whose_logits_are_more_than_its_head_takes_the_whole_logits_path():
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(Gemma2Config(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                           num_key_value_heads=2, head_dim=8, intermediate_size=64, pad_token_id=0,
                                           final_logit_softcapping=5.0))
    assert not plain_head(model)
    want, want_ent, mask = _whole(model, 1.0, 1.0, 0)
    logp, ent, _ = response_logprobs(model, PROMPTS, RESPONSES, 0, temperature=1.0)
    assert torch.allclose(logp[mask], want[mask], atol=1e-6) and torch.allclose(ent[mask], want_ent[mask], atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_under_bf16_autocast_on_cuda_the_chunks_match_the_whole_logits(monkeypatch):
    """The policy's forward on CUDA runs under bf16 autocast: the chunks' head runs in bf16 in the forward and,
    recomputed, in the backward (custom_fwd / custom_bwd keep the autocast state), as the whole-logits path does."""
    model = _llama(tied=True).cuda()
    monkeypatch.setattr(head_logprobs, "CHUNK_ELEMENTS", 3 * V)
    weights = torch.randn(3, 5, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want_logp, want_ent, mask = _whole(model, 0.7, 0.9, 40)
    want = _grads(model, want_logp, mask, weights)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert plain_head(model)  # the chunked path is the one taken under autocast
        logp, ent, _ = response_logprobs(model, PROMPTS, RESPONSES, 0, temperature=0.7, top_p=0.9, top_k=40)
    got = _grads(model, logp, mask, weights)
    assert torch.allclose(logp[mask], want_logp[mask], atol=1e-3) and torch.allclose(ent[mask], want_ent[mask],
                                                                                      atol=1e-3)
    for n in want:
        assert torch.allclose(got[n], want[n], atol=2e-2, rtol=2e-2), (n, (got[n] - want[n]).abs().max())
