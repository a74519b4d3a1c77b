"""One dense step (train_step with an objective) in a world of one: DPO against a reference equal to the policy
starts at log 2 with zero rewards; gradient checkpointing changes neither loss nor gradients for DPO, the reward
model and distillation; a pair laid out with its prompt once (share_prompt) gives the loss, metrics and gradients
of two rows; the numerics gate stops a DPO step before the optimizer moves."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.config import DistillConfig, DPOConfig, RewardModelConfig
from posttrain.models.io import load_model, load_tokenizer
from posttrain.sft.batching import collate, collate_units, shared_prefix_length
from posttrain.sft.objectives import objective_for
from posttrain.sft.trainer import NonFiniteError, build_trainee, train_step, wrap

PAIRS = [{"messages": [{"role": "user", "content": f"{a}+{a * 3}="}],
          "chosen": [{"role": "assistant", "content": str(a * 4)}],
          "rejected": [{"role": "assistant", "content": str(a * 4 + 1)}]} for a in range(1, 9)]
DEMOS = [{"messages": p["messages"] + p["chosen"]} for p in PAIRS]


def _batches(objective, tok, examples, pack):
    items = [objective.encode(ex, tok, 64) for ex in examples]
    half = len(items) // 2
    return [collate([s for it in part for s in it], pack=pack, pack_length=48, pad_id=tok.pad_token_id)
            for part in (items[:half], items[half:])]


CONFIGS = {"dpo": DPOConfig(nproc=1, global_batch_size=8, micro_batch_size=4, max_grad_norm=0.0, sft_weight=0.5),
           "reward_model": RewardModelConfig(nproc=1, global_batch_size=8, micro_batch_size=4, max_grad_norm=0.0),
           "distill": DistillConfig(nproc=1, global_batch_size=8, micro_batch_size=4, max_grad_norm=0.0,
                                    teacher="t", temperature=2.0)}


def test_dpo_against_a_reference_equal_to_the_policy_starts_at_log_2(folders, world_of_one):
    tok = load_tokenizer(folders["tok"])
    objective = objective_for(DPOConfig(nproc=1, global_batch_size=8, micro_batch_size=4))
    model = wrap(load_model(folders["llama"]), objective.cfg, world_of_one)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    m = train_step(model, opt, _batches(objective, tok, PAIRS, pack=True), cfg=objective.cfg, info=world_of_one,
                   lr=0.0, autocast=False, objective=objective, frozen=load_model(folders["llama"]))
    assert m["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert m["rewards/chosen"] == m["rewards/rejected"] == 0 and m["accuracy"] == 0 and m["pairs"] == 8


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gradient_checkpointing_same_loss_and_gradients(folders, world_of_one, name):
    tok = load_tokenizer(folders["tok"])
    objective = objective_for(CONFIGS[name])
    examples = DEMOS if name == "distill" else PAIRS
    frozen = load_model(folders["tiny"]) if name == "distill" else load_model(folders["llama"])
    results = []
    for gc in (False, True):
        torch.manual_seed(0)  # the reward model's fresh head
        model = wrap(build_trainee(objective.name, None, tok, folders["llama"]), objective.cfg, world_of_one,
                     gradient_checkpointing=gc)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        grads = {}
        orig = opt.step

        def capture(*a, _m=model, _g=grads, _s=orig, **kw):
            _g.update({n: p.grad.detach().clone() for n, p in _m.named_parameters() if p.grad is not None})
            return _s(*a, **kw)

        opt.step = capture
        m = train_step(model, opt, _batches(objective, tok, examples, pack=True), cfg=objective.cfg, info=world_of_one,
                       lr=0.0, autocast=False, objective=objective, frozen=None if name == "reward_model" else frozen)
        results.append((m, grads))
    (ma, ga), (mb, gb) = results
    assert ma["loss"] == pytest.approx(mb["loss"], abs=1e-5) and ma["loss"] > 0
    assert ga.keys() == gb.keys() and len(ga) > 5
    assert max(float((ga[k] - gb[k]).abs().max()) for k in ga) < 1e-5


def _step_with_grads(objective, model, batches, frozen, world_of_one):
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    grads = {}
    orig = opt.step

    def capture(*a, **kw):
        grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        return orig(*a, **kw)

    opt.step = capture
    m = train_step(model, opt, batches, cfg=objective.cfg, info=world_of_one, lr=0.0, autocast=False,
                   objective=objective, frozen=frozen)
    return m, grads


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("name", ["dpo", "reward_model"])
def test_a_shared_prompt_gives_the_numbers_of_two_rows(folders, world_of_one, name, pack):
    tok = load_tokenizer(folders["tok"])
    objective = objective_for(CONFIGS[name])
    items = [objective.encode(ex, tok, 64) for ex in PAIRS]
    assert all(shared_prefix_length(*it) >= 5 for it in items)  # the prompt and the assistant header are shared
    frozen = load_model(folders["llama"]) if name == "dpo" else None
    results = []
    for share in (False, True):
        torch.manual_seed(0)  # the reward model's fresh head
        model = wrap(build_trainee(objective.name, None, tok, folders["llama"]), objective.cfg, world_of_one)
        batches = [collate_units(part, pack=pack, pack_length=48, pad_id=tok.pad_token_id, share_prefix=share)
                   for part in (items[:4], items[4:])]
        results.append((_step_with_grads(objective, model, batches, frozen, world_of_one),
                        sum(int((b.seq_index >= 0).sum()) for b in batches),  # positions laid out
                        sum(b.num_tokens for b in batches)))
    ((ma, ga), laid_a, tokens_a), ((mb, gb), laid_b, tokens_b) = results
    shared = sum(shared_prefix_length(*it) for it in items)
    assert tokens_a == tokens_b and laid_b == laid_a - shared  # same work; the prompts went through once
    assert ma.keys() == mb.keys()
    for k in ma:
        assert ma[k] == pytest.approx(mb[k], abs=1e-5), k
    assert ga.keys() == gb.keys() and len(ga) > 5
    assert max(float((ga[k] - gb[k]).abs().max()) for k in ga) < 1e-5


def test_a_non_finite_dpo_loss_stops_before_the_optimizer_step(folders, world_of_one):
    tok = load_tokenizer(folders["tok"])
    objective = objective_for(DPOConfig(nproc=1, global_batch_size=8, micro_batch_size=4))
    model = wrap(load_model(folders["llama"]), objective.cfg, world_of_one)
    batches = _batches(objective, tok, PAIRS, pack=False)
    with torch.no_grad():
        getattr(model, "module", model).get_input_embeddings().weight[int(batches[0].input_ids[0, 0])] = math.nan
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.raises(NonFiniteError, match=r"^dpo step stopped before the optimizer step: loss nan"):
        train_step(model, opt, batches, cfg=objective.cfg, info=world_of_one, lr=1e-2, autocast=False,
                   objective=objective, frozen=load_model(folders["llama"]))
    assert not opt.state
