"""The policy worker's update on a pretrained-like model: same truncated log-probs as the reference, gradient
checkpointing changes neither loss nor gradients (policy update and SFT, DDP and FSDP2), and the gates that
stop an update before its optimizer step (drift, non-finite gradient norm)."""

from __future__ import annotations

import pytest
import torch

from posttrain.config import LossAgg, ModelConfig, Parallelism, RLConfig, SFTConfig
from posttrain.data.chat import tokenize_for_training
from posttrain.models.io import load_model, load_tokenizer
from posttrain.rl.types import TrainBatch
from posttrain.sft.batching import collate


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
    assert abs(a.loss - c.loss) < 1e-5 and abs(a.grad_norm - c.grad_norm) < 1e-5
    assert max(float((wa[k] - wc[k]).abs().max()) for k in wa) < 1e-5


def test_the_heap_is_trimmed_after_every_micro_batch(folders, world_of_one, monkeypatch):
    """Each micro-batch's forward and backward is followed by `return_free_memory` (freed activations back to
    the OS before the next one, when at least TRIM_AT_LEAST is free), and the update ends with an unconditional
    one after the optimizer step."""
    from posttrain.rl.roles import policy as policy_mod

    rl = RLConfig(temperature=1.0, lr=1e-3)
    b = _policy_batch(folders, rl)
    w = policy_mod.PolicyWorker(str(folders["llama"]), rl, 0, 1)
    w.setup_process_group("127.0.0.1", 0, 60)
    events: list[str] = []
    backward = w._backward
    monkeypatch.setattr(w, "_backward", lambda *a, **k: (events.append("backward"), backward(*a, **k))[1])
    monkeypatch.setattr(policy_mod, "return_free_memory",
                        lambda at_least=0: events.append(f"trim >= {at_least}") or True)
    res = w.update(b, global_tokens=sum(len(r) for r in b.response_ids), global_seqs=6, n_micro=3)
    assert res.applied and w.version == 1
    assert events == ["backward", f"trim >= {policy_mod.TRIM_AT_LEAST}"] * 3 + ["trim >= 0"]


def test_policy_update_gates_stop_before_the_optimizer_step(folders, world_of_one):
    """Drift above rl.drift_threshold (measured by the update's own first forward), a non-finite loss and a
    non-finite gradient norm stop the update before its optimizer step: weights and version unchanged, the reason returned."""
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
    assert not res.applied and abs(res.drift - 1.0) < 1e-3 and "rl.drift_threshold" in res.stopped
    assert w.checksum() == before and w.version == 0
    res = update(replace(b, advantages=[math.nan] + b.advantages[1:]))  # a poisoned advantage
    assert not res.applied and res.stopped.startswith("loss is nan"), res.stopped
    assert w.checksum() == before and w.version == 0
    p = next(iter(w.model.parameters()))
    hook = p.register_hook(lambda g: g * math.inf)  # a finite loss whose gradient overflows
    res = update(b)
    hook.remove()
    assert not res.applied and "gradient norm is" in res.stopped, res.stopped
    assert w.checksum() == before and w.version == 0
    res = update(b)  # the same batch, unpoisoned: the drift check passes and the step is taken
    assert res.applied and res.drift < 1e-4 and w.version == 1 and w.checksum() != before


def test_a_one_rank_policy_keeps_no_gradients_between_updates(folders, world_of_one):
    """With one rank there is nothing to all-reduce: the model is not wrapped in DDP (whose buckets would keep
    the gradients' memory between updates) and after an update no parameter holds a gradient."""
    from posttrain.rl.roles.policy import PolicyWorker

    rl = RLConfig(temperature=1.0, lr=1e-3)
    b = _policy_batch(folders, rl)
    w = PolicyWorker(str(folders["llama"]), rl, 0, 1)
    w.setup_process_group("127.0.0.1", 0, 60)
    assert w.net is w.model and not isinstance(w.net, torch.nn.parallel.DistributedDataParallel)
    res = w.update(b, global_tokens=sum(len(r) for r in b.response_ids), global_seqs=6, n_micro=2)
    assert res.applied and res.grad_norm > 0
    assert all(p.grad is None for p in w.model.parameters())


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


def test_a_non_finite_sft_loss_stops_before_the_optimizer_step(folders, world_of_one):
    """SFT's gate: a NaN loss (here a poisoned embedding row the batch reads) raises NonFiniteError naming loss
    and gradient norm, and no optimizer step touches the other weights."""
    import math

    from posttrain.sft.trainer import NonFiniteError, train_step, wrap

    tok = load_tokenizer(folders["tok"])
    enc = [tokenize_for_training(tok, [{"role": "user", "content": f"{a}+1="}, {"role": "assistant", "content": str(a + 1)}],
                                 64) for a in range(4)]
    batch = collate(enc, pack=False, pack_length=40, pad_id=tok.pad_token_id)
    cfg = SFTConfig(nproc=1, global_batch_size=4, micro_batch_size=4)
    model = wrap(load_model(folders["llama"]), cfg, world_of_one, gradient_checkpointing=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    emb = model.module.get_input_embeddings().weight if hasattr(model, "module") else model.get_input_embeddings().weight
    with torch.no_grad():
        emb[int(batch.input_ids[0, 0])] = math.nan
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(NonFiniteError, match=r"loss nan, gradient norm nan"):
        train_step(model, opt, [batch], cfg=cfg, info=world_of_one, lr=1e-2, autocast=False)
    after = dict(model.named_parameters())
    assert all(torch.equal(before[n], after[n].detach()) for n in before if "embed" not in n)
    assert not opt.state  # AdamW never stepped


@pytest.mark.parametrize("loss_agg", [LossAgg.TOKEN_MEAN, LossAgg.SEQ_MEAN])
def test_rows_without_gradient_are_not_run_and_the_update_is_the_same(folders, world_of_one, loss_agg):
    """Without a KL term, the group sends only the rows with a non-zero advantage, with the whole batch's
    normaliser: the loss, the gradient norm and the new weights are those of the update on every row. With a
    KL term every row is sent; a batch with no gradient at all still sends one row per rank (the step runs)."""
    from dataclasses import replace

    from posttrain.rl.remote import LocalActor
    from posttrain.rl.roles.common import worker_identity
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.roles.policy_group import PolicyGroup, rows_with_gradient

    rl = RLConfig(temperature=1.0, lr=1e-3, loss_agg=loss_agg)
    b = replace(_policy_batch(folders, rl), advantages=[1.0, -1.0, 0.0, 0.0, 2.0, -2.0])
    tokens = sum(len(r) for r in b.response_ids)
    full_worker = PolicyWorker(str(folders["llama"]), rl, 0, 1)
    full_worker.setup_process_group("127.0.0.1", 0, 60)
    full, wf = full_worker.update(b, global_tokens=tokens, global_seqs=6, n_micro=2), full_worker.state_dict()
    w = PolicyWorker(str(folders["llama"]), rl, 0, 1)
    group = PolicyGroup([LocalActor(w)], [worker_identity("policy", 0, 1)], 60, micro_batch_size=2)
    (shard,), counts = group._shard(b, list(range(6)))
    assert shard.advantages == [1.0, -1.0, 2.0, -2.0]
    assert counts == (tokens, 6, 2)  # the whole batch's tokens and sequences
    w.setup_process_group("127.0.0.1", 0, 60)
    part, wp = group.update(b), w.state_dict()  # through the group: shards, sends, gathers, counts the skipped
    assert part.skipped_rows == 2 and part.policy_version == 1
    assert full.applied and part.applied and full.grad_norm > 0
    assert abs(full.loss - part.loss) < 1e-6 and abs(full.grad_norm - part.grad_norm) < 1e-6 * full.grad_norm
    assert max(float((wf[k] - wp[k]).abs().max()) for k in wf) < 1e-5  # AdamW magnifies rounding (steps ~1e-3)
    with_kl = replace(b, ref_logprobs=b.old_logprobs)  # a zero-advantage row still pulls towards the reference
    assert rows_with_gradient(with_kl, list(range(6)), 1) == list(range(6))
    none = replace(b, advantages=[0.0] * 6, response_ids=[[1] * n for n in (3, 1, 4, 1, 5, 2)])
    assert len(rows_with_gradient(none, list(range(6)), 2)) == 2  # one per rank, the shortest
    assert rows_with_gradient(none, list(range(6)), 2) == sorted(sorted(range(6), key=lambda i: (
        len(none.prompt_ids[i]) + len(none.response_ids[i]), i))[:2])
    per_token = replace(b, advantages=[[0.0, 0.0], [0.0, 0.5]] + [[0.0]] * 4)  # PPO: a row with one non-zero token
    assert rows_with_gradient(per_token, list(range(6)), 1) == [1]


def test_environment_tokens_are_context_only_in_the_policy_update(folders, world_of_one):
    """A multi-turn episode's environment tokens (`sampled` 0) are in the forward but in no loss term, statistic
    or token count: what the batch holds at those positions (their recorded log-probs) changes nothing, while
    the same batch without the mask trains on them."""
    import dataclasses

    from posttrain.rl.ragged import trained_tokens
    from posttrain.rl.roles.policy import PolicyWorker

    rl = RLConfig(temperature=1.0, lr=1e-3, kl_coef=0.0)
    b = _policy_batch(folders, rl)
    sampled = [[0 if 0 < t < len(r) - 1 and t % 2 else 1 for t in range(len(r))] for r in b.response_ids]
    assert any(0 in m for m in sampled)
    masked = dataclasses.replace(b, sampled=sampled)
    moved = dataclasses.replace(masked, old_logprobs=[[lp + (3.0 if not s else 0.0) for lp, s in zip(r, m)]
                                                       for r, m in zip(b.old_logprobs, sampled)])

    def update(batch):
        w = PolicyWorker(str(folders["llama"]), rl, 0, 1)
        w.setup_process_group("127.0.0.1", 0, 60)
        tokens = sum(trained_tokens(batch, i) for i in range(len(batch.response_ids)))
        return w.update(batch, global_tokens=tokens, global_seqs=6, n_micro=2), w.state_dict()

    (ra, wa), (rb, wb), (rc, wc) = update(masked), update(moved), update(dataclasses.replace(moved, sampled=None))
    assert sum(trained_tokens(masked, i) for i in range(6)) == sum(map(sum, sampled)) < sum(map(len, b.response_ids))
    assert ra.tokens == rb.tokens == sum(map(sum, sampled)) and rc.tokens == sum(map(len, b.response_ids))
    assert abs(ra.loss - rb.loss) < 1e-6 and max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-7
    assert max(float((wa[k] - wc[k]).abs().max()) for k in wa) > 1e-5  # without the mask they are trained on
