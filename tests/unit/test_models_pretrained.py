"""Pretrained models as they are: every EOS id stops generation, top-p/top-k sampling with log-probs of the
truncated distribution on both the sampling and the teacher-forced side, the pad-token fallback (and that
padding never hides a real EOS from the loss), dtype rules, the NCCL/gloo choice, and a rollout engine holding bf16 weights. (The policy update:
test_policy_update.py; loading in transformers 4.57: test_checkpoint_compat.py; shared fixtures: conftest.py.)"""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from posttrain.config import DType, ModelConfig
from posttrain.data.chat import tokenize_for_training
from posttrain.models.generate import forward_response_logits, generate, sampling_logprobs
from posttrain.models.head_logprobs import sequence_logprobs
from posttrain.models.io import compute_dtype, eos_token_ids, load_model, load_tokenizer
from posttrain.models.tiny import build_model
from posttrain.rl.weight_sync import weights_checksum
from posttrain.sft.batching import collate


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, pad_token_id=0, eos_token_id=1, attn_implementation="sdpa")
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a peakier next-token distribution, so top-p really cuts
        m.lm_head.weight.mul_(8)
    return m


PROMPTS = [[3, 4, 5], [6, 7], [8, 9, 10, 11, 12], [13]]


# ----------------------------------------------------------------------------------------------- EOS ids


def test_eos_token_ids_union_of_generation_config_and_tokenizer(folders, tmp_path):
    assert eos_token_ids(folders["llama"]) == [folders["user"], folders["eos"]]
    assert eos_token_ids(folders["tiny"]) == [folders["eos"]]
    d = tmp_path / "m"
    shutil.copytree(folders["tiny"], d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert eos_token_ids(d) == [7, folders["eos"]]
    (d / "generation_config.json").unlink()  # then config.json's
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "eos_token_id": [5, folders["eos"]]}))
    assert eos_token_ids(d) == [5, folders["eos"]]


def test_generate_stops_a_row_at_any_of_several_eos_ids(model):
    free = generate(model, PROMPTS, max_new_tokens=8, temperature=0.0, eos_id=39, pad_id=0)
    row = free[0].response_ids
    stop = row[2] if row[2] not in row[:2] else row[3]
    gens = generate(model, PROMPTS, max_new_tokens=8, temperature=0.0, eos_id=[39, stop], pad_id=0)
    assert gens[0].finished and gens[0].response_ids == row[:row.index(stop) + 1]
    for f, g in zip(free, gens):  # every row is cut at its first stop id, or not at all
        cut = [i for i, t in enumerate(f.response_ids) if t in (39, stop)]
        assert g.response_ids == (f.response_ids[:cut[0] + 1] if cut else f.response_ids)
        assert g.finished == bool(cut)


# ----------------------------------------------------------------------------------------------- top-p / top-k


def test_top_k_1_sampling_equals_greedy(model):
    greedy = generate(model, PROMPTS, max_new_tokens=6, temperature=0.0, eos_id=1, pad_id=0)
    sampled = generate(model, PROMPTS, max_new_tokens=6, temperature=1.0, top_k=1, n=3, eos_id=1, pad_id=0, seed=3)
    assert [g.response_ids for g in sampled] == [g.response_ids for g in greedy for _ in range(3)]
    assert all(abs(lp) < 1e-6 for g in sampled for lp in g.logprobs)  # one token left: probability 1


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 0.7, 0), (0.8, 1.0, 4), (1.3, 0.85, 6)])
def test_truncated_sampling_logprobs_equal_teacher_forced(model, temperature, top_p, top_k):
    gens = generate(model, PROMPTS, max_new_tokens=8, temperature=temperature, top_p=top_p, top_k=top_k, n=4,
                    eos_id=1, pad_id=0, seed=2)
    lp = sequence_logprobs(model, [g.prompt_ids for g in gens], [g.response_ids for g in gens],
                           temperature=temperature, top_p=top_p, top_k=top_k, pad_id=0, batch_size=5)
    diff = max(float((torch.tensor(g.logprobs) - x).abs().max()) for g, x in zip(gens, lp))
    assert diff < 1e-4
    full = sequence_logprobs(model, [g.prompt_ids for g in gens], [g.response_ids for g in gens],
                             temperature=temperature, pad_id=0)
    # the truncated distribution is renormalised: every token is at least as likely as without truncation,
    # and strictly more likely somewhere (else this test would not test truncation)
    gaps = torch.cat([a - b for a, b in zip(lp, full)])
    assert float(gaps.min()) > -1e-5 and float(gaps.max()) > 1e-3


def test_tokens_outside_top_k_and_top_p_never_sampled(model):
    with torch.no_grad():
        logits = model(torch.tensor([[3, 4]])).logits[0, -1]
    probs = torch.softmax(logits, -1)
    n = 3000
    for top_k, top_p in [(3, 1.0), (0, 0.6)]:
        gens = generate(model, [[3, 4]], max_new_tokens=1, temperature=1.0, top_k=top_k, top_p=top_p, n=n, eos_id=1,
                        pad_id=0, seed=0, batch_size=1000)
        order = probs.argsort(descending=True).tolist()
        if top_k:
            allowed = order[:top_k]
        else:
            mass_before = (probs[order].cumsum(0) - probs[order]).tolist()
            allowed = [t for t, m in zip(order, mass_before) if m < top_p]
        assert 1 < len(allowed) < 40
        counts = Counter(g.response_ids[0] for g in gens)
        assert set(counts) <= set(allowed), f"sampled outside the kept set: {set(counts) - set(allowed)}"
        renorm = probs[allowed] / probs[allowed].sum()
        for tok, p in zip(allowed, renorm.tolist()):
            assert abs(counts[tok] / n - p) < 0.04


def test_teacher_forced_target_outside_the_kept_set_stays_finite():
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0]], requires_grad=True)
    lp = sampling_logprobs(logits, torch.tensor([2]), 1.0, top_k=2)  # token 2 is not in the top 2
    kept = torch.log_softmax(torch.tensor([4.0, 3.0, 0.0]), -1)[2]  # renormalised over the top 2 plus it
    assert torch.isfinite(lp).all() and abs(float(lp) - float(kept)) < 1e-6
    lp.sum().backward()
    assert torch.isfinite(logits.grad).all() and float(logits.grad[0, 3]) == 0.0


# ----------------------------------------------------------------------------------------------- pad fallback


def test_pad_fallback_is_eos_and_logged_once(folders, tmp_path, caplog):
    d = tmp_path / "nopad"
    shutil.copytree(folders["tiny"], d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("pad_token")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with caplog.at_level(logging.WARNING, logger="posttrain.models.io"):
        tok = load_tokenizer(d)
        load_tokenizer(d)
    assert tok.pad_token == tok.eos_token and tok.pad_token_id == folders["eos"]
    assert sum("no pad token" in r.getMessage() for r in caplog.records) == 1
    cfg.pop("eos_token")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"{d}.*neither a pad token nor an EOS token"):
        load_tokenizer(d)


def test_pad_equal_to_eos_never_hides_a_real_eos_from_the_loss(folders):
    tok = load_tokenizer(folders["tok"])
    eos = tok.eos_token_id
    convs = [[{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}],
             [{"role": "user", "content": "12+34="}, {"role": "assistant", "content": "46 is the answer"}]]
    enc = [tokenize_for_training(tok, c, 64) for c in convs]
    for pack in (False, True):
        b = collate(enc, pack=pack, pack_length=64, pad_id=eos)  # pad == eos
        assert b.num_loss_tokens == sum(sum(m[1:]) for _, m in enc)  # every assistant token, EOS included
        assert int((b.labels == eos).sum()) == len(enc)  # each example's own EOS is a target, no padding is
    # RL: response masks come from lengths, so a response ending in eos == pad keeps its last token
    m = build_model(ModelConfig(), tok)
    _, targets, mask = forward_response_logits(m, [[5, 6, 7], [5]], [[8, eos], [8, 9, 10, eos]], pad_id=eos)
    assert mask.sum(1).tolist() == [2, 4] and targets[0, 1] == eos and targets[1, 3] == eos


# ----------------------------------------------------------------------------------------------- dtype / device


def test_dtype_rules_bf16_only_on_cuda(folders):
    assert compute_dtype(DType.BF16, "cpu") == torch.float32
    assert compute_dtype(DType.BF16, "cuda") == torch.bfloat16
    assert compute_dtype(DType.FP32, "cuda") == torch.float32
    assert compute_dtype(None, "cuda") == torch.float32
    m = load_model(folders["llama"], device="cpu", dtype=DType.BF16)
    assert {p.dtype for p in m.parameters()} == {torch.float32}


def test_nccl_only_when_every_rank_has_its_own_gpu():
    from posttrain.spmd.dist import choose_backend

    assert choose_backend(["GPU-a", "GPU-b"]) == "nccl"
    assert choose_backend(["GPU-a"]) == "nccl"
    assert choose_backend(["GPU-a", "GPU-a"]) == "gloo"  # two ranks on one GPU: NCCL would refuse
    assert choose_backend(["cpu", "cpu"]) == "gloo"
    assert choose_backend(["GPU-a", "cpu"]) == "gloo"


def test_rollout_engine_holding_bf16_weights_reports_the_checksum_of_what_it_was_sent(folders):
    from posttrain.rl.roles.rollout import TransformersEngine

    engine = TransformersEngine(str(folders["tiny"]), device="cpu")
    sent = {k: v.to(torch.bfloat16) for k, v in load_model(folders["llama"]).state_dict().items()}
    sent = {k: (v if v.shape == engine.model.state_dict()[k].shape else engine.model.state_dict()[k].to(torch.bfloat16))
            for k, v in sent.items() if k in engine.model.state_dict()}
    engine.load_weights(sent)
    assert engine.checksum() == weights_checksum(sent)
    assert engine.eos_ids == [folders["eos"]]


# ----------------------------------------------------------------------------------------------- RL roles in-process
