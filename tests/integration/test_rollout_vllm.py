"""The vLLM rollout engine against the transformers one and the policy's log-probs (marked `vllm`).

Runs in the optional environment only: `make test-vllm` (pytest -m vllm in .venv-vllm, after
`make install-vllm`); elsewhere every test here is skipped, saying so. One engine per module (starting one
takes seconds); the weight-push tests leave the engine holding the folder's weights again.

Thresholds (fp32 on CPU, measured on this machine): greedy token ids identical; per-token log-probs of
sampled tokens within LOGPROB_ATOL of `sequence_logprobs` (the policy's teacher-forced log-probs under the
same temperature / top-k / top-p), far below rl.drift_threshold's default of 0.05 (mean |diff|).
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import torch

from posttrain.config.checks import vllm_installed
from posttrain.rl.roles.rollout import RolloutWorker
from posttrain.rl.types import WeightReport, WeightsHandle, WorkerId
from posttrain.rl.weight_sync import StaleWeightsError, verify_reports, weights_checksum

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed here: `make install-vllm`, "
                                 "then `make test-vllm` runs these tests in .venv-vllm")]

LOGPROB_ATOL = 1e-3
"""Max |vLLM - policy| per token, fp32 on CPU (measured max ~1e-5 on the tiny model)."""
MAX_SEQ_LEN = 64


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A from-scratch tiny Llama with the project's tokenizer (its greedy outputs repeat a token or two)."""
    from posttrain.config import ModelConfig
    from posttrain.models.io import load_tokenizer, save_model
    from posttrain.models.tiny import build_model
    from posttrain.models.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("vllm_tiny")
    texts = [f"{a}+{b}={a + b}" for a in range(0, 100, 3) for b in range(0, 100, 7)]
    train_tokenizer(texts, 300, root / "tok")
    tok = load_tokenizer(root / "tok")
    save_model(build_model(ModelConfig(max_seq_len=MAX_SEQ_LEN), tok), tok, root / "model")
    return root / "model"


@pytest.fixture(scope="module")
def engines(tiny_dir):
    """(transformers engine, vLLM engine) on the tiny model, after three of its tokens were made extra EOS ids
    in generation_config.json (both read the stop ids at start), so the stop handling is exercised."""
    from posttrain.rl.roles.rollout import TransformersEngine
    from posttrain.rl.roles.rollout_vllm import VLLMEngine

    hf = TransformersEngine(str(tiny_dir), device="cpu")
    prompts = _prompts(hf.tokenizer)
    greedy = Counter(t for g in hf.generate(prompts, n=1, temperature=0.0, max_new_tokens=12, seed=0)
                     for t in g.response_ids)
    sampled = Counter(t for g in hf.generate(prompts, n=4, temperature=1.0, max_new_tokens=12, seed=0)
                      for t in g.response_ids)
    extra_eos = sorted(greedy, key=greedy.get)[:2]  # the rarest greedy tokens: some greedy rows stop, some not
    extra_eos += [t for t, _ in sampled.most_common() if t not in extra_eos][5:6]  # sampled rows stop at any length
    cfg_path = tiny_dir / "generation_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["eos_token_id"] = [*extra_eos, hf.tokenizer.eos_token_id]
    cfg_path.write_text(json.dumps(cfg))
    hf = TransformersEngine(str(tiny_dir), device="cpu")  # again: it reads the stop ids at start
    vl = VLLMEngine(str(tiny_dir), max_model_len=MAX_SEQ_LEN)
    assert vl.eos_ids == hf.eos_ids and len(vl.eos_ids) == 4
    return hf, vl


def _prompts(tok) -> list[list[int]]:
    return [tok.encode(f"{a}+{b}=", add_special_tokens=False) for a, b in [(1, 2), (13, 29), (7, 70), (55, 5),
                                                                          (3, 99), (40, 2), (8, 8), (91, 9)]]


def test_greedy_matches_transformers(engines):
    hf, vl = engines
    prompts = _prompts(hf.tokenizer)
    a = hf.generate(prompts, n=2, temperature=0.0, max_new_tokens=24, seed=0)
    b = vl.generate(prompts, n=2, temperature=0.0, max_new_tokens=24, seed=0)
    assert [g.response_ids for g in b] == [g.response_ids for g in a]
    assert [g.finished for g in b] == [g.finished for g in a] and any(g.finished for g in b)
    assert all(g.response_ids[-1] in vl.eos_ids for g in b if g.finished)
    diff = max(abs(x - y) for ga, gb in zip(a, b) for x, y in zip(ga.logprobs, gb.logprobs))
    print(f"greedy: {len(b)} samples identical; max |logprob diff| {diff:.2e}")
    assert diff < LOGPROB_ATOL


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 0.8, 20)])
def test_sampled_logprobs_match_the_policy(engines, temperature, top_p, top_k):
    from posttrain.models.head_logprobs import sequence_logprobs

    hf, vl = engines
    prompts = _prompts(hf.tokenizer)
    gens = vl.generate(prompts, n=4, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=24, seed=1)
    assert len(gens) == 4 * len(prompts) and [g.prompt_ids for g in gens] == [p for p in prompts for _ in range(4)]
    assert len({tuple(g.response_ids) for g in gens}) > len(prompts)  # the n samples of a prompt differ
    assert all(len(g.logprobs) == len(g.response_ids) for g in gens)
    ref = sequence_logprobs(hf.model, [g.prompt_ids for g in gens], [g.response_ids for g in gens],
                            temperature=temperature, top_p=top_p, top_k=top_k, pad_id=hf.tokenizer.pad_token_id)
    diffs = torch.cat([(torch.tensor(g.logprobs) - r).abs() for g, r in zip(gens, ref)])
    print(f"T={temperature} top_p={top_p} top_k={top_k}: {diffs.numel()} tokens, max |diff| "
          f"{diffs.max():.2e}, mean {diffs.mean():.2e}")
    assert diffs.max() < LOGPROB_ATOL
    again = vl.generate(prompts, n=4, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=24, seed=1)
    assert [g.response_ids for g in again] == [g.response_ids for g in gens]  # seeded


def _perturbed(model, seed: int) -> dict[str, torch.Tensor]:
    """The model's state dict with noise on every matrix; tied tensors (embeddings / head) stay one tensor."""
    g = torch.Generator().manual_seed(seed)
    new: dict[int, torch.Tensor] = {}
    for v in model.state_dict().values():
        if v.data_ptr() not in new:
            new[v.data_ptr()] = v + 0.3 * v.std() * torch.randn(v.shape, generator=g) if v.dim() == 2 else v.clone()
    return {k: new[v.data_ptr()] for k, v in model.state_dict().items()}


def test_weight_push_changes_outputs_like_the_policy(engines, tmp_path):
    """Push new weights into the live engine (through the shared-memory file, lazily, as an RL run does):
    its greedy ids and log-probs follow the transformers engine given the same weights; its checksum is
    that of the new weights; pushing the original back restores the original outputs."""
    from posttrain.models.head_logprobs import sequence_logprobs
    from posttrain.rl import weight_transfer

    hf, vl = engines
    prompts = _prompts(hf.tokenizer)
    original = {k: v.clone() for k, v in hf.model.state_dict().items()}
    kw = {"n": 4, "temperature": 1.0, "max_new_tokens": 16, "seed": 3}
    greedy0, sampled0 = vl.generate(prompts, n=1, temperature=0.0, max_new_tokens=16, seed=0), vl.generate(prompts, **kw)
    c0 = vl.checksum()
    assert c0 == weights_checksum(original)
    new = _perturbed(hf.model, 0)
    with weight_transfer.read(weight_transfer.write(new, tmp_path, version=1, node="n"), "n") as lazy:
        vl.load_weights(lazy)
    hf.load_weights(new)
    a = hf.generate(prompts, n=1, temperature=0.0, max_new_tokens=16, seed=0)
    b = vl.generate(prompts, n=1, temperature=0.0, max_new_tokens=16, seed=0)
    assert [g.response_ids for g in b] == [g.response_ids for g in a]
    assert max(abs(x - y) for ga, gb in zip(a, b) for x, y in zip(ga.logprobs, gb.logprobs)) < LOGPROB_ATOL
    moved = max(abs(x - y) for g0, gb in zip(greedy0, b) for x, y in zip(g0.logprobs, gb.logprobs))
    sampled = vl.generate(prompts, **kw)
    ref = sequence_logprobs(hf.model, [g.prompt_ids for g in sampled], [g.response_ids for g in sampled],
                            temperature=1.0, pad_id=hf.tokenizer.pad_token_id)
    diff = max((torch.tensor(g.logprobs) - r).abs().max().item() for g, r in zip(sampled, ref))
    print(f"after the push: greedy log-probs moved by up to {moved:.3f}; sampled vs policy max |diff| {diff:.2e}")
    assert moved > 0.05 and diff < LOGPROB_ATOL
    assert [g.response_ids for g in sampled] != [g.response_ids for g in sampled0]
    assert vl.checksum() == hf.checksum() == weights_checksum(new) != c0
    vl.load_weights(original)
    hf.load_weights(original)
    assert [g.response_ids for g in vl.generate(prompts, **kw)] == [g.response_ids for g in sampled0]
    assert vl.checksum() == c0


def test_weight_push_refuses_wrong_names(engines):
    hf, vl = engines
    state = dict(hf.model.state_dict())
    state["model.extra.weight"] = state.pop("model.norm.weight")
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\].*unexpected \['model.extra.weight'\]"):
        vl.load_weights(state)


class StaleWorker(RolloutWorker):
    """Acknowledges each new version but pushes the previous sync's weights back (a dropped transfer)."""

    def load_weights(self, state, version: int) -> WeightReport:
        previous = getattr(self, "previous", None)
        super().load_weights(state, version)
        if previous is not None:
            self.engine.load_weights(previous)
        self.previous = dict(state)
        return WeightReport(worker=self.id, version=version, checksum=self.engine.checksum())


def _worker(cls, engine) -> RolloutWorker:
    w = cls.__new__(cls)  # the module's engine instead of starting another
    w.engine, w.version = engine, 0
    w.id = WorkerId(role="rollout", rank=0, world_size=1, node="n", pid=os.getpid())
    return w


def test_stale_vllm_worker_is_detected(engines):
    """The weight-sync check stops a vLLM worker that reports a new version while holding the previous one."""
    hf, vl = engines
    original = {k: v.clone() for k, v in hf.model.state_dict().items()}
    good, stale = _worker(RolloutWorker, vl), _worker(StaleWorker, vl)
    try:
        for version in (1, 2):
            state = _perturbed(hf.model, version)
            handle = WeightsHandle(version=version, checksum=weights_checksum(state), payload=state)
            verify_reports(handle, [good.load_weights(state, version)])
            report = stale.load_weights(state, version)
        with pytest.raises(StaleWeightsError, match=r"rollout\[0/1\].*reports version 2 checksum"):
            verify_reports(handle, [report])
    finally:
        vl.load_weights(original)


def test_eval_backend_vllm_scores_like_transformers(tiny_dir, tmp_path):
    """eval.backend=vllm: the same greedy answers, hence the same accuracy, as the transformers backend."""
    from dataclasses import replace

    from posttrain.config import DataConfig, EvalConfig, RolloutBackend
    from posttrain.data.prepare import prepare_dataset
    from posttrain.eval import evaluate

    prepare_dataset(DataConfig(num_examples=64, eval_size=16, num_digits=2), tmp_path / "data")
    cfg = EvalConfig(num_problems=16, k=2, max_new_tokens=8)
    a = evaluate(tiny_dir, tmp_path / "data", cfg)
    b = evaluate(tiny_dir, tmp_path / "data", replace(cfg, backend=RolloutBackend.VLLM))
    assert [x["greedy"] for x in b.samples] == [x["greedy"] for x in a.samples]
    assert (b.num_problems, b.greedy_accuracy, b.k) == (a.num_problems, a.greedy_accuracy, a.k)
    assert b.pass_at_k is not None and b.mean_response_tokens > 0


@pytest.mark.timeout(900)
def test_multi_turn_episodes_on_vllm_are_token_exact(tiny_sft_model):
    """Episodes with the retry game (a wrong answer is told "no" and tried again) on the shared tiny SFT model:
    vLLM's greedy episodes are the transformers engine's, token for token and mask for mask, over several
    turns; its sampled episodes' log-probs at every sampled token are the policy's teacher-forced ones over the
    whole episode (the environment's tokens in the context, not sampled: log-prob 0). Then eval.backend vllm
    with eval.environment scores the same episodes as the transformers backend."""
    from dataclasses import replace

    from posttrain.config import EpisodeConfig, EvalConfig, RolloutBackend
    from posttrain.envs.episodes import EpisodeLayout, EpisodeLimits, LocalEnv, run_episodes
    from posttrain.envs.host import EnvironmentHost
    from posttrain.eval import evaluate
    from posttrain.models.head_logprobs import sequence_logprobs
    from posttrain.rl.roles.rollout import TransformersEngine
    from posttrain.rl.roles.rollout_vllm import VLLMEngine
    from tests.integration.retry_env import Retry

    model_dir = str(tiny_sft_model["model_dir"])
    hf, vl = TransformersEngine(model_dir, device="cpu"), VLLMEngine(model_dir)
    layout = EpisodeLayout.check(vl.tokenizer, vl.eos_ids)
    rows = [{"answer": a} for a in ("46", "none", "never", "47")]  # the model answers 46: right once, then told "no"
    messages = [[{"role": "user", "content": "12+34="}]] * len(rows)
    limits = EpisodeLimits(max_turns=3, max_new_tokens=12, max_total_tokens=100)

    def episodes(engine, n, temperature, seed):
        return run_episodes(engine, layout, LocalEnv(EnvironmentHost(Retry)), rows, messages, n=n, limits=limits,
                            temperature=temperature, seed=seed)

    a, b = episodes(hf, 1, 0.0, 0), episodes(vl, 1, 0.0, 0)
    assert [e.response_ids for e in b] == [e.response_ids for e in a] and [e.sampled for e in b] == [e.sampled for e in a]
    assert [e.transcript for e in b] == [e.transcript for e in a] and max(e.turns for e in b) >= 2
    sampled = episodes(vl, 2, 1.0, 3)
    multi = [e for e in sampled if 0 in e.sampled]
    assert multi, [e.transcript for e in sampled]  # some episodes took several turns, the game's tokens between
    ref = sequence_logprobs(hf.model, [e.prompt_ids for e in sampled], [e.response_ids for e in sampled],
                            temperature=1.0, pad_id=hf.tokenizer.pad_token_id)
    diffs = [abs(lp - float(r[t])) for e, r in zip(sampled, ref)
             for t, (lp, s) in enumerate(zip(e.logprobs, e.sampled)) if s]
    assert all(lp == 0.0 for e in sampled for lp, s in zip(e.logprobs, e.sampled) if not s)
    print(f"vLLM episodes: {len(sampled)}, {len(multi)} over several turns; {len(diffs)} sampled tokens, "
          f"max |logprob - teacher-forced| {max(diffs):.2e}")
    assert max(diffs) < LOGPROB_ATOL

    data = tiny_sft_model["dataset_dir"]
    cfg = EvalConfig(num_problems=16, k=0, max_new_tokens=8, environment="tests.integration.retry_env:Retry",
                     episode=EpisodeConfig(max_turns=3, max_total_tokens=60))
    plain, fast = evaluate(model_dir, data, cfg), evaluate(model_dir, data, replace(cfg, backend=RolloutBackend.VLLM))
    assert [p["episode"] for p in fast.problems] == [p["episode"] for p in plain.problems]
    assert fast.greedy_accuracy == plain.greedy_accuracy and fast.episodes == plain.episodes
    assert plain.episodes["turns_mean"] > 1


@pytest.mark.real_model
@pytest.mark.timeout(600)
def test_greedy_matches_transformers_on_smollm2(smollm2_dir):
    """SmolLM2-135M-Instruct, chat prompts as the RL recipe builds them: identical greedy ids."""
    from posttrain.data.chat import encode_prompt
    from posttrain.rl.roles.rollout import TransformersEngine
    from posttrain.rl.roles.rollout_vllm import VLLMEngine

    hf = TransformersEngine(str(smollm2_dir), device="cpu")
    questions = ["What is 12 + 35?", "Name a primary colour.", "Say hello in French.", "What is 7 times 8?",
                 "Give one word that rhymes with cat.", "What is the capital of Italy?"]
    prompts = [encode_prompt(hf.tokenizer, [{"role": "user", "content": q}]) for q in questions]
    a = hf.generate(prompts, n=1, temperature=0.0, max_new_tokens=32, seed=0)
    del hf
    vl = VLLMEngine(str(smollm2_dir), max_model_len=256)
    b = vl.generate(prompts, n=1, temperature=0.0, max_new_tokens=32, seed=0)
    same = sum(x.response_ids == y.response_ids for x, y in zip(a, b))
    diff = max(abs(x - y) for ga, gb in zip(a, b) for x, y in zip(ga.logprobs, gb.logprobs))
    print(f"SmolLM2 greedy: {same}/{len(a)} identical; max |logprob diff| on the common prefix {diff:.2e}")
    assert same == len(a)
    assert [g.finished for g in b] == [g.finished for g in a]
