"""Generation log-probs equal the teacher-forced ones; greedy equals a naive loop; sampling follows
softmax(logits / T); evaluation metrics are computed as defined."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from posttrain.models.generate import generate
from posttrain.models.head_logprobs import sequence_logprobs


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, pad_token_id=0, eos_token_id=1, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


PROMPTS = [[3, 4, 5], [6, 7], [8, 9, 10, 11, 12], [13]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_match_teacher_forced_logprobs(model, temperature):
    gens = generate(model, PROMPTS, max_new_tokens=8, temperature=temperature, n=3, eos_id=1, pad_id=0, seed=1)
    assert len(gens) == 12 and [g.prompt_ids for g in gens[:3]] == [PROMPTS[0]] * 3
    lp = sequence_logprobs(model, [g.prompt_ids for g in gens], [g.response_ids for g in gens],
                           temperature=temperature, pad_id=0, batch_size=5)
    diff = max(float((torch.tensor(g.logprobs) - x).abs().max()) for g, x in zip(gens, lp))
    assert diff < 1e-4


def test_greedy_equals_a_naive_loop_and_eos_stops(model):
    gens = generate(model, PROMPTS, max_new_tokens=6, temperature=0.0, eos_id=1, pad_id=0)
    for p, g in zip(PROMPTS, gens):
        seq = list(p)
        for _ in range(len(g.response_ids)):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
        assert seq[len(p):] == g.response_ids
        assert g.finished == (g.response_ids[-1] == 1) and (g.finished or len(g.response_ids) == 6)


def test_sampling_is_seeded_and_follows_the_tempered_distribution(model):
    a = generate(model, PROMPTS, max_new_tokens=4, temperature=1.0, n=2, eos_id=1, pad_id=0, seed=5)
    b = generate(model, PROMPTS, max_new_tokens=4, temperature=1.0, n=2, eos_id=1, pad_id=0, seed=5)
    assert [g.response_ids for g in a] == [g.response_ids for g in b]
    n = 4000
    gens = generate(model, [[3, 4]], max_new_tokens=1, temperature=0.5, n=n, eos_id=1, pad_id=0, seed=0, batch_size=1000)
    counts = Counter(g.response_ids[0] for g in gens)
    probs = torch.softmax(model(torch.tensor([[3, 4]])).logits[0, -1] / 0.5, -1)
    for tok, c in counts.most_common(3):
        assert abs(c / n - float(probs[tok])) < 0.03


@pytest.mark.timeout(900)
def test_evaluation_metrics(tmp_path, tiny_sft_model):
    from posttrain.config import EvalConfig, RewardConfig
    from posttrain.eval import EvalReport, evaluate

    r = evaluate(tiny_sft_model["model_dir"], tiny_sft_model["dataset_dir"], EvalConfig(num_problems=100, k=4,
                                                                                         max_new_tokens=8))
    assert r.num_problems == 100 and 0.0 <= r.sampled_accuracy <= r.pass_at_k <= 1.0
    assert r.pass_at_k > 0, r.samples[:3]  # the fixture model gets some problems right
    cold = evaluate(tiny_sft_model["model_dir"], tiny_sft_model["dataset_dir"],
                    EvalConfig(num_problems=100, k=2, temperature=0.01, max_new_tokens=8))
    assert cold.sampled_accuracy == pytest.approx(cold.greedy_accuracy, abs=0.02)  # T -> 0 is greedy
    # A dataset whose answers are perturbed scores 0: the verifier really compares.
    ds = tmp_path / "wrong"
    ds.mkdir()
    rows = [json.loads(x) for x in (tiny_sft_model["dataset_dir"] / "eval.jsonl").read_text().splitlines()[:50]]
    for row in rows:
        row["answer"] = "x" + row["answer"]
    (ds / "eval.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    assert evaluate(tiny_sft_model["model_dir"], ds, EvalConfig(num_problems=50, k=1, max_new_tokens=8)).pass_at_k == 0
    assert EvalReport.from_json(r.to_json()) == r
    user = evaluate(tiny_sft_model["model_dir"], tiny_sft_model["dataset_dir"],
                    EvalConfig(num_problems=100, k=1, max_new_tokens=8), RewardConfig(fn="tests.reward_fns:always_one"))
    assert user.greedy_accuracy == 1.0 and user.scorer == "tests.reward_fns:always_one" and user.reward_failures == 0
    greedy_only = evaluate(tiny_sft_model["model_dir"], tiny_sft_model["dataset_dir"],
                           EvalConfig(num_problems=100, k=0, max_new_tokens=8))
    assert greedy_only.greedy_accuracy == r.greedy_accuracy  # greedy does not depend on k
    assert greedy_only.sampled_accuracy is None and greedy_only.pass_at_k is None


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_batched_response_logits_and_gradients_equal_each_row_alone(attn):
    """Left-padded prompts, right-padded responses, logits for the response columns only: the same log-probs
    and the same weight gradients as each row run alone without padding (a NaN from a fully masked padding
    row, or a position off by one, would show here)."""
    from posttrain.models.generate import forward_response_logits, token_logprobs

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, pad_token_id=0, eos_token_id=1, attn_implementation=attn)
    m = LlamaForCausalLM(cfg).train()
    prompts, responses = [[3, 4, 5], [6], [8, 9, 10, 11, 12]], [[7, 8, 1], [9, 10, 11, 12, 1], [13]]

    seen = []
    hook = m.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].shape[1]))
    logits, targets, mask = forward_response_logits(m, prompts, responses, pad_id=0)
    hook.remove()
    assert seen == [5] and logits.shape[:2] == (3, 5)  # the head ran on the 5 response columns only
    lp = token_logprobs(logits, targets, 1.0)
    (lp * mask).sum().backward()
    batched = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()

    alone = []
    for p, r in zip(prompts, responses):
        out = m(input_ids=torch.tensor([p + r[:-1]]), use_cache=False).logits[0, len(p) - 1:]
        x = token_logprobs(out, torch.tensor(r), 1.0)
        x.sum().backward()
        alone.append(x.detach())
    for i, x in enumerate(alone):
        assert torch.allclose(lp[i, :len(x)].detach(), x, atol=1e-5)
        assert not mask[i, len(x):].any()
    for n, p in m.named_parameters():
        assert torch.isfinite(batched[n]).all(), n
        assert torch.allclose(batched[n], p.grad, atol=1e-5), n
