"""A prompt's samples scored with the prompt once (posttrain.models.prompt_sharing) give the padded rows' log-probs,
entropies and parameter gradients - full fine-tuning and LoRA, one-token and long responses - while the model
sees each prompt once per row; generation runs each distinct prompt's prefill once and its samples decode the
same tokens as separate rows would."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from posttrain.config import LoraConfig
from posttrain.models.attention_bias import attention_bias
from posttrain.models.generate import distinct_rows, generate
from posttrain.models.head_logprobs import plain_head, response_logprobs
from posttrain.models.lora import add_adapters
from posttrain.models.prompt_sharing import shared_prompt_layout

V = 512
A, B, C = [5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]
PROMPTS = [A, A, A, B, C, B, A]  # a group of four (one apart from the rest), a pair, a prompt alone
RESPONSES = [[20, 21, 22], [23], [24, 25, 26, 27, 28], [29, 30], [31, 32, 33], [34], [35, 36]]


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, pad_token_id=0,
                                        attn_implementation="sdpa"))


def _grads(model, logp, mask, weights):
    model.zero_grad(set_to_none=True)
    (logp * weights * mask).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("temperature, top_p, top_k", [(1.0, 1.0, 0), (0.7, 0.9, 40)])
def test_shared_rows_give_the_padded_rows_values_and_gradients(lora, temperature, top_p, top_k):
    model = _llama()
    if lora:
        add_adapters(model, LoraConfig(rank=4, alpha=8.0), seed=0)
        for n, p in model.named_parameters():  # B = 0 at the start would hide the adapters' gradient path
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.1)
    weights = torch.randn(len(PROMPTS), 5)
    assert plain_head(model)  # checked once per model, on 3 tokens: before the hook counts the forwards
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    out = {}
    for share in (False, True):
        logp, ent, mask = response_logprobs(model, PROMPTS, RESPONSES, 0, temperature=temperature, top_p=top_p,
                                            top_k=top_k, share_prompt=share)
        out[share] = (logp, ent, mask, _grads(model, logp, mask, weights))
    hook.remove()
    (want_lp, want_ent, want_mask, want), (lp, ent, mask, got) = out[False], out[True]
    assert torch.equal(mask, want_mask) and mask.sum() == sum(len(r) for r in RESPONSES)
    assert torch.allclose(lp[mask], want_lp[mask], atol=1e-5)
    assert torch.allclose(ent[mask], want_ent[mask], atol=1e-5) and not ent.requires_grad
    assert (lp[~mask] == 0).all()
    assert set(got) == set(want) and (not lora or all("lora_" in n for n in got))
    for n in want:
        assert torch.allclose(got[n], want[n], atol=1e-5, rtol=1e-4), n
    # padded: 7 rows of 6 + 5 - 1 columns; shared: one row per distinct prompt, each prompt once
    assert seen[0] == (7, 10)
    assert seen[1] == (3, len(A) + 2 + 0 + 4 + 1)  # A + its responses' inputs ([20, 21], [], [24..27], [35])


def test_the_layout_masks_each_response_to_its_prompt_and_itself():
    lay = shared_prompt_layout([A, A], [[20, 21, 22], [23, 24]], pad_id=0)
    assert lay.input_ids.tolist() == [A + [20, 21, 23]]
    assert lay.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 6]]  # the second response restarts at len(A)
    allowed = (lay.attention_mask[0, 0] == 0).int().tolist()
    assert allowed[7] == [1] * 8 + [0]  # 21 sees the prompt, 20 and itself
    assert allowed[8] == [1] * 6 + [0, 0, 1]  # 23 sees the prompt and itself, never the other response
    assert lay.read.tolist() == [5, 6, 7, 5, 8]  # A's last token predicts both first tokens
    assert lay.targets.tolist() == [20, 21, 22, 23, 24]


def test_long_responses_split_a_prompt_over_rows_and_nothing_shared_builds_no_mask():
    long = [list(range(20, 40))] * 3  # 2 x (prompt 2 + response 20) = 44 columns hold two 19-token inputs
    lay = shared_prompt_layout([B, B, B], long, pad_id=0)
    assert lay.input_ids.shape == (2, 2 + 19 + 19)
    assert shared_prompt_layout([A, B, C], [[1], [2], [3]], pad_id=0) is None
    assert distinct_rows([A, B, A, C, B]) == ([A, B, C], [0, 1, 0, 2, 1])


def test_generation_prefills_each_distinct_prompt_once_and_decodes_as_separate_rows():
    model = _llama().eval()
    calls = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: calls.append(tuple(i[0].shape)))
    shared = generate(model, [A, B], max_new_tokens=5, temperature=0.0, n=3, eos_id=1, pad_id=0)
    hook.remove()
    assert calls[0] == (2, len(A)) and calls[1] == (6, 1)  # prefill: 2 prompts; decoding: 6 rows
    apart = generate(model, [A, A, A, B, B, B], max_new_tokens=5, temperature=0.0, n=1, eos_id=1, pad_id=0)
    alone = [generate(model, [p], max_new_tokens=5, temperature=0.0, eos_id=1, pad_id=0)[0] for p in (A, B)]
    assert [g.response_ids for g in shared] == [g.response_ids for g in apart]
    assert [g.response_ids for g in shared] == [alone[0].response_ids] * 3 + [alone[1].response_ids] * 3
    for g, a in zip(shared, [alone[0]] * 3 + [alone[1]] * 3):
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(a.logprobs), atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["bf16 weights", "bf16 autocast"])
def test_shared_rows_on_cuda_match_the_padded_rows(precision):
    """On CUDA the 4D mask goes to the GPU's attention kernels: as the bf16 rollout / reference models score
    (bf16 weights) and as the policy's update runs (fp32 weights under bf16 autocast), shared rows give the
    padded rows' log-probs within bf16 rounding, nothing is NaN, and the update's gradients agree."""
    model = _llama().cuda()
    if precision == "bf16 weights":
        model = model.to(torch.bfloat16)
    weights = torch.randn(len(PROMPTS), 5, device="cuda")
    out = {}
    for share in (False, True):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16 autocast"):
            logp, ent, mask = response_logprobs(model, PROMPTS, RESPONSES, 0, temperature=0.7, top_p=0.9,
                                                top_k=40, share_prompt=share)
        out[share] = (logp, ent, mask, _grads(model, logp, mask, weights))
    (want_lp, want_ent, want_mask, want), (lp, ent, mask, got) = out[False], out[True]
    assert torch.equal(mask, want_mask)
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    assert torch.allclose(lp[mask], want_lp[mask], atol=0.05), (lp[mask] - want_lp[mask]).abs().max()
    assert torch.allclose(ent[mask], want_ent[mask], atol=0.05)
    for n in want:
        g, w = got[n].float(), want[n].float()
        assert torch.isfinite(g).all(), n
        assert torch.nn.functional.cosine_similarity(g.flatten(), w.flatten(), dim=0) > 0.99, n


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_generation_on_cuda_prefills_each_prompt_once_with_the_separate_rows_tokens():
    model = _llama().cuda().eval()
    shared = generate(model, [A, B], max_new_tokens=5, temperature=0.0, n=3, eos_id=1, pad_id=0)
    apart = generate(model, [A, A, A, B, B, B], max_new_tokens=5, temperature=0.0, n=1, eos_id=1, pad_id=0)
    assert [g.response_ids for g in shared] == [g.response_ids for g in apart]
    low = generate(model.to(torch.bfloat16), [A, B], max_new_tokens=5, temperature=1.0, n=3, eos_id=1, pad_id=0)
    assert len(low) == 6 and all(len(g.response_ids) >= 1 for g in low)
    assert all(torch.isfinite(torch.tensor(g.logprobs)).all() for g in low)


def test_the_mask_reaches_attention_in_the_dtype_attention_computes_in():
    """cuDNN's attention reads an fp32 mask beside bf16 queries as bf16 (models/attention_bias.py): the mask
    follows the model's weights, or the autocast dtype where autocast is on."""
    lay = shared_prompt_layout([A, A], [[20, 21], [23]], pad_id=0)
    cpu = torch.device("cpu")
    model = _llama()
    assert attention_bias(lay.attention_mask, model, cpu).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attention_bias(lay.attention_mask, model, cpu).dtype == torch.bfloat16
    low = attention_bias(lay.attention_mask, model.to(torch.bfloat16), cpu)
    assert low.dtype == torch.bfloat16 and torch.equal(low.isinf(), lay.attention_mask.isinf())
