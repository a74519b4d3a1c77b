"""Pretrained models as they are: every EOS id stops generation, top-p/top-k sampling with log-probs of the
truncated distribution on both the sampling and the teacher-forced side, the pad-token fallback (and that
padding never hides a real EOS from the loss), dtype rules, gradient checkpointing (same loss and gradients),
the NCCL/gloo choice; and checkpoints that transformers 4.57 loads unchanged (slow: installs it once)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from posttrain.config import DType, ModelConfig, Parallelism, RLConfig, SFTConfig
from posttrain.data.chat import tokenize_for_training
from posttrain.models.generate import forward_response_logits, generate, sampling_logprobs, sequence_logprobs
from posttrain.models.io import compute_dtype, eos_token_ids, load_model, load_tokenizer, save_model
from posttrain.models.tiny import build_model
from posttrain.models.tokenizer import train_tokenizer
from posttrain.rl.types import TrainBatch
from posttrain.rl.weight_sync import weights_checksum
from posttrain.sft.batching import collate

TEXTS = [f"{a}+{b}={a + b}" for a in range(0, 100, 3) for b in range(0, 100, 7)] + ["the answer is"] * 4


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The project's own trained tokenizer; a tiny from-scratch model saved with it; a pretrained-like Llama
    (rope_theta 5e5, untied head, two EOS ids in its config) saved with the same tokenizer."""
    root = tmp_path_factory.mktemp("pretrained")
    train_tokenizer(TEXTS, 300, root / "tok")
    tok = load_tokenizer(root / "tok")
    save_model(build_model(ModelConfig(), tok), tok, root / "tiny")
    torch.manual_seed(1)
    user = tok.convert_tokens_to_ids("<|user|>")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, rope_theta=500000.0, max_position_embeddings=256,
                      tie_word_embeddings=False, eos_token_id=[user, tok.eos_token_id], pad_token_id=None,
                      bos_token_id=None)
    save_model(LlamaForCausalLM(cfg), tok, root / "llama")
    return {"root": root, "tok": root / "tok", "tiny": root / "tiny", "llama": root / "llama", "user": user,
            "eos": tok.eos_token_id}


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
    from posttrain.rl.roles.policy import choose_backend

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


@pytest.fixture()
def world_of_one(monkeypatch):
    """A gloo process group of one rank in this process (removed afterwards)."""
    import torch.distributed as dist

    from posttrain.sft.dist import _free_port, init_distributed

    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(k, v)
    info = init_distributed()
    yield info
    dist.destroy_process_group()


def _policy_batch(folders, rl: RLConfig) -> TrainBatch:
    from posttrain.rl.roles.rollout import TransformersEngine

    tok = load_tokenizer(folders["llama"])
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ["1+2=", "33+4=", "the answer is 7"]]
    eng = TransformersEngine(str(folders["llama"]), device="cpu")
    gens = eng.generate(prompts, n=2, temperature=rl.temperature, max_new_tokens=6, seed=0, top_p=rl.top_p,
                        top_k=rl.top_k)
    return TrainBatch(policy_version=0, prompt_ids=[g.prompt_ids for g in gens],
                      response_ids=[g.response_ids for g in gens], old_logprobs=[g.logprobs for g in gens],
                      ref_logprobs=None, advantages=[1.0, -1.0, 0.5, -0.5, 2.0, -2.0])


def test_policy_and_reference_score_rollouts_with_the_same_truncation(folders, world_of_one):
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.roles.reference import ReferenceWorker

    rl = RLConfig(temperature=0.9, top_p=0.8, top_k=20)
    b = _policy_batch(folders, rl)
    policy = PolicyWorker(str(folders["llama"]), rl, 0, 1)
    ref = ReferenceWorker(str(folders["llama"]), 0, 1, cfg=rl)
    for worker in (policy, ref):
        lp, _ = worker.log_probs(b.prompt_ids, b.response_ids, rl.temperature)
        diff = max(abs(a - c) for x, y in zip(b.old_logprobs, lp) for a, c in zip(x, y))
        assert diff < 1e-4
    untruncated, _ = ReferenceWorker(str(folders["llama"]), 0, 1).log_probs(b.prompt_ids, b.response_ids, 0.9)
    assert max(abs(a - c) for x, y in zip(b.old_logprobs, untruncated) for a, c in zip(x, y)) > 1e-3


def test_gradient_checkpointing_same_policy_update(folders, world_of_one):
    from posttrain.rl.roles.policy import PolicyWorker

    rl = RLConfig(temperature=1.0, top_p=0.9, lr=1e-3)
    b = _policy_batch(folders, rl)
    out = []
    for gc in (False, True):
        w = PolicyWorker(str(folders["llama"]), rl, 0, 1, model_cfg=ModelConfig(gradient_checkpointing=gc))
        w.setup_process_group("127.0.0.1", 0, 60)
        assert w.model.is_gradient_checkpointing == gc
        res = w.update(b, global_tokens=sum(len(r) for r in b.response_ids), global_seqs=6, n_micro=2)
        out.append((res, w.state_dict()))
    (a, wa), (c, wc) = out
    assert abs(a["loss"] - c["loss"]) < 1e-5 and abs(a["grad_norm"] - c["grad_norm"]) < 1e-5
    assert max(float((wa[k] - wc[k]).abs().max()) for k in wa) < 1e-5


def test_policy_update_gates_stop_before_the_optimizer_step(folders, world_of_one):
    """Drift above rl.drift_threshold (measured by the update's own first forward) and a non-finite gradient
    norm stop the update before its optimizer step: weights and version unchanged, the reason returned."""
    import math
    from dataclasses import replace

    from posttrain.rl.roles.policy import PolicyWorker

    rl = RLConfig(temperature=1.0, lr=1e-3)
    b = _policy_batch(folders, rl)
    w = PolicyWorker(str(folders["llama"]), rl, 0, 1)
    w.setup_process_group("127.0.0.1", 0, 60)
    before, n = w.checksum(), sum(len(r) for r in b.response_ids)

    def update(batch):
        return w.update(batch, global_tokens=n, global_seqs=6, n_micro=2, drift_threshold=0.05)

    res = update(replace(b, old_logprobs=[[x - 1.0 for x in row] for row in b.old_logprobs]))  # a stale rollout
    assert not res["applied"] and abs(res["drift"] - 1.0) < 1e-3 and "rl.drift_threshold" in res["stopped"]
    assert w.checksum() == before and w.version == 0
    res = update(replace(b, advantages=[math.nan] + b.advantages[1:]))  # a poisoned advantage
    assert not res["applied"] and "gradient norm is nan" in res["stopped"], res["stopped"]
    assert w.checksum() == before and w.version == 0
    res = update(b)  # the same batch, unpoisoned: the drift check passes and the step is taken
    assert res["applied"] and res["drift"] < 1e-4 and w.version == 1 and w.checksum() != before


@pytest.mark.parametrize("parallelism", [Parallelism.DDP, Parallelism.FSDP2])
def test_gradient_checkpointing_same_sft_loss_and_gradients(folders, world_of_one, parallelism):
    from posttrain.sft.trainer import train_step, wrap

    tok = load_tokenizer(folders["tok"])
    convs = [[{"role": "user", "content": f"{a}+{a * 3}="}, {"role": "assistant", "content": str(a * 4)}]
             for a in range(1, 9)]
    enc = [tokenize_for_training(tok, c, 64) for c in convs]
    batches = [collate(enc[:4], pack=True, pack_length=40, pad_id=tok.pad_token_id),  # packed: 4D block mask
               collate(enc[4:], pack=False, pack_length=40, pad_id=tok.pad_token_id)]
    assert batches[0].input_ids.shape[0] < 4  # really packed
    cfg = SFTConfig(nproc=1, global_batch_size=8, micro_batch_size=4, max_grad_norm=0.0, parallelism=parallelism)
    results = []
    for gc in (False, True):
        model = wrap(load_model(folders["llama"]), cfg, world_of_one, gradient_checkpointing=gc)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # keep the weights: compare the gradients
        grads = {}
        orig_step = opt.step

        def capture(*args, _m=model, _g=grads, _s=orig_step, **kw):
            for n, p in _m.named_parameters():
                _g[n] = p.grad.detach().full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.detach().clone()
            return _s(*args, **kw)

        opt.step = capture
        m = train_step(model, opt, batches, cfg=cfg, info=world_of_one, lr=0.0, autocast=False)
        results.append((m, grads))
    (ma, ga), (mb, gb) = results
    assert abs(ma["loss"] - mb["loss"]) < 1e-5 and ma["loss"] > 0
    assert ga.keys() == gb.keys() and len(ga) > 5
    assert max(float((ga[k] - gb[k]).abs().max()) for k in ga) < 1e-5


# ----------------------------------------------------------------------------------------------- transformers 4.57


CHECK_SCRIPT = r"""
import json, sys
import torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d)
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
text = tok.apply_chat_template([{"role": "user", "content": "12+34="}], tokenize=False, add_generation_prompt=True)
ids = tok(text, add_special_tokens=False)["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0]
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=8, do_sample=False)
print("RESULT" + json.dumps({"version": transformers.__version__, "text": text, "ids": ids, "logits": logits.tolist(),
      "generated": out[0, len(ids):].tolist(), "pad": tok.pad_token_id, "eos": model.generation_config.eos_token_id}))
"""


@pytest.fixture(scope="session")
def transformers_457(request):
    """transformers 4.57.6 + tokenizers 0.22.2 (and their dependencies) installed once with pip --target into
    pytest's cache folder."""
    target = Path(request.config.cache.mkdir("transformers-4.57.6"))
    if not (target / "transformers-4.57.6.dist-info").exists():
        p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
                            "transformers==4.57.6", "tokenizers==0.22.2"], check=False, capture_output=True, text=True,
                           timeout=600)
        if p.returncode != 0:
            if any(s in p.stderr for s in ("Could not find a version", "NewConnectionError", "Network is unreachable",
                                           "Temporary failure in name resolution", "No matching distribution")):
                pytest.skip(f"PyPI cannot be reached to install transformers 4.57.6: {p.stderr.strip()[-300:]}")
            raise AssertionError(f"pip install transformers==4.57.6 failed:\n{p.stderr[-3000:]}")
    return target


def _run_check(model_dir: Path, pythonpath: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    p = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, str(model_dir)], check=False, capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.split("RESULT", 1)[1])


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["tiny", "llama"])
def test_saved_checkpoint_loads_unchanged_in_transformers_457(folders, transformers_457, name):
    new = _run_check(folders[name], None)
    old = _run_check(folders[name], str(transformers_457))
    assert old["version"] == "4.57.6" and new["version"].startswith("5.")
    assert old["text"] == new["text"] and old["ids"] == new["ids"]
    diff = float((torch.tensor(old["logits"]) - torch.tensor(new["logits"])).abs().max())
    assert diff < 1e-4, f"{name}: logits differ by {diff} between transformers 4.57 and 5"
    assert old["generated"] == new["generated"]
    assert old["pad"] == new["pad"] is not None
    assert old["eos"] == new["eos"] == ([folders["user"], folders["eos"]] if name == "llama" else folders["eos"])
    cfg = json.loads((folders[name] / "config.json").read_text())
    assert cfg["rope_theta"] == (500000.0 if name == "llama" else 10000.0) and "quantization_config" not in cfg
