"""On a multi-turn tool episode, our policy loss with its per-token mask equals TRL 1.16.0's GRPOTrainer loss with
its `tool_mask`, within 1e-6 (fixed inputs).

The episode is one of ours (posttrain.envs.episodes, the Calculator tool, turns scripted as in
tests/unit/test_episodes.py): its `sampled` mask is TRL's `tool_mask` by the same definition (TRL's
`_tool_call_loop`: 0 on every token appended between two generated turns - the tool's result and the template
around it -, 1 on generated tokens, log-prob 0.0 on the appended ones). Four such rows of different lengths,
fixed rollout / reference / current log-probs (float64), per-sequence advantages; TRL side:
GRPOTrainer._compute_loss on an instance made with object.__new__ plus the attributes it reads, its per-token
log-prob function replaced by the fixed values (TRL runs in a subprocess with its own folder on PYTHONPATH, as in
tests/unit/test_dense_losses_trl.py; trl is never imported here). Compared: loss_type "bnpo" (our token_mean),
"grpo" (our seq_mean), "dr_grpo" (our seq_mean_token_sum_norm with TRL's max_completion_length), each with
and without the k3 KL term (beta / rl.kl_coef), clipping engaged; and that dropping the mask changes the loss.

And the episode itself: TRL's own tool loop (`_tool_call_loop`: its call parser, tool call and tool-result
suffix), fed the same sampled turns, holds exactly our episode's prompt ids, response ids and mask.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from posttrain.config import KLEstimator, LossAgg
from posttrain.envs.builtin import Calculator
from posttrain.envs.calls import render_call
from posttrain.envs.episodes import EpisodeLayout, EpisodeLimits, run_episodes
from posttrain.rl.algorithms.grpo import policy_loss
from tests.unit.test_dense_losses_trl import _trl_dir
from tests.unit.test_episodes import TEXTS, Script, in_process

ROOT = Path(__file__).resolve().parents[2]
CLIP_LOW, CLIP_HIGH = 0.2, 0.28

TRL_SCRIPT = r'''
import json, sys
from collections import defaultdict
from types import SimpleNamespace
import torch
from trl.trainer.grpo_trainer import GRPOTrainer

x = json.load(sys.stdin)
T = lambda v: torch.tensor(v, dtype=torch.float64)
logps, mask, tool = T(x["logps"]), torch.tensor(x["completion_mask"]), torch.tensor(x["tool_mask"])
acc = SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t, gather_for_metrics=lambda t: t,
                      reduce=lambda t, reduction="sum": t, num_processes=1, sync_gradients=True)
out = {}
for loss_type in ("bnpo", "grpo", "dr_grpo"):
    for beta in (0.0, 0.05):
        for with_tool in (True, False):
            t = object.__new__(GRPOTrainer)
            t.__dict__.update(model=SimpleNamespace(training=True), accelerator=acc,
                              _metrics={"train": defaultdict(list)}, aux_loss_enabled=False,
                              top_entropy_quantile=1.0, off_policy_mask_threshold=None,
                              importance_sampling_level="token", beta=beta, loss_type=loss_type,
                              epsilon_low=x["clip_low"], epsilon_high=x["clip_high"], use_vllm=False,
                              vllm_importance_sampling_correction=False, current_gradient_accumulation_steps=1,
                              max_completion_length=mask.shape[1], _entropy_bonus_enabled=False,
                              args=SimpleNamespace(use_bias_correction_kl=False, delta=None))
            t._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros_like(logps), None)
            inputs = {"prompt_ids": torch.zeros(mask.shape[0], 2, dtype=torch.long),
                      "prompt_mask": torch.ones(mask.shape[0], 2, dtype=torch.long),
                      "completion_ids": torch.zeros_like(mask), "completion_mask": mask,
                      "advantages": T(x["advantages"]), "old_per_token_logps": T(x["old"]),
                      "ref_per_token_logps": T(x["ref"])}
            if with_tool:
                inputs["tool_mask"] = tool
            out[f"{loss_type}/{beta}/{with_tool}"] = float(t._compute_loss(None, inputs))
print(json.dumps(out))
'''

AGG = {"bnpo": LossAgg.TOKEN_MEAN, "grpo": LossAgg.SEQ_MEAN, "dr_grpo": LossAgg.SEQ_MEAN_TOKEN_SUM_NORM}


def _episode_masks() -> list[list[int]]:
    """`sampled` of four tool episodes of different shapes, from our episode runner."""
    import tempfile

    from posttrain.models.io import load_tokenizer
    from posttrain.models.tokenizer import train_tokenizer

    with tempfile.TemporaryDirectory() as d:
        train_tokenizer(TEXTS, 300, d)
        tok = load_tokenizer(d)
    stop = tok.eos_token_id
    layout = EpisodeLayout.check(tok, [stop])
    call = render_call("calculate", {"expression": "12 * 3"})
    masks = []
    for turns in ([call, "36"], [call, call, "The answer is 36."], ["36"], [call, "no idea, 35"]):
        (ep,) = run_episodes(Script(tok, stop, turns), layout, in_process(Calculator), [{}],
                             [[{"role": "user", "content": "12 * 3?"}]], n=1,
                             limits=EpisodeLimits(max_turns=3, max_new_tokens=64), temperature=1.0, seed=0)
        masks.append(ep.sampled)
    return masks


@pytest.fixture(scope="module")
def case():
    sampled = _episode_masks()
    B, L = len(sampled), max(map(len, sampled))
    g = torch.Generator().manual_seed(0)
    completion = torch.zeros(B, L, dtype=torch.long)
    tool = torch.ones(B, L, dtype=torch.long)  # TRL pads tool_mask with 1 (completion_mask 0 there)
    for i, m in enumerate(sampled):
        completion[i, :len(m)] = 1
        tool[i, :len(m)] = torch.tensor(m)
    old = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3 * completion * tool  # 0 on appended tokens
    logps = old + torch.randn(B, L, generator=g, dtype=torch.float64) * 0.4  # ratios outside [0.8, 1.28] too
    ref = old + torch.randn(B, L, generator=g, dtype=torch.float64) * 0.3
    x = {"logps": logps.tolist(), "old": old.tolist(), "ref": ref.tolist(), "completion_mask": completion.tolist(),
         "tool_mask": tool.tolist(), "advantages": [1.0, -0.5, 0.75, -1.25], "clip_low": CLIP_LOW,
         "clip_high": CLIP_HIGH}
    env = {**os.environ, "PYTHONPATH": str(_trl_dir()), "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([str(ROOT / ".venv/bin/python"), "-c", TRL_SCRIPT], input=json.dumps(x), env=env,
                       check=False, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    return x, sampled, json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("loss_type", list(AGG))
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_the_episode_policy_loss_equals_trls_with_its_tool_mask(case, loss_type, beta):
    from posttrain.rl.ragged import loss_mask
    from posttrain.rl.types import TrainBatch

    x, sampled, theirs = case
    B, L = len(sampled), len(x["logps"][0])
    batch = TrainBatch(policy_version=0, prompt_ids=[[0]] * B, response_ids=[[0] * len(m) for m in sampled],
                       old_logprobs=[], ref_logprobs=None, advantages=x["advantages"], sampled=sampled)
    mask = loss_mask(batch, 0, B, (B, L))  # what the policy worker trains on
    assert mask.long().tolist() == (torch.tensor(x["completion_mask"]) * torch.tensor(x["tool_mask"])).tolist()
    T = lambda k: torch.tensor(x[k], dtype=torch.float64)
    for masked in (True, False):
        m = mask if masked else torch.tensor(x["completion_mask"]).bool()
        ours, _ = policy_loss(T("logps"), T("old"), torch.tensor(x["advantages"], dtype=torch.float64), m,
                              clip_low=CLIP_LOW, clip_high=CLIP_HIGH, loss_agg=AGG[loss_type],
                              ref_logp=T("ref") if beta else None, kl_coef=beta, kl_estimator=KLEstimator.K3,
                              normalizer=B * L if loss_type == "dr_grpo" else None)
        assert abs(float(ours) - theirs[f"{loss_type}/{beta}/{masked}"]) < 1e-6, (masked, float(ours), theirs)
    assert abs(theirs[f"{loss_type}/{beta}/True"] - theirs[f"{loss_type}/{beta}/False"]) > 1e-4  # the mask matters


# Runs TRL's own tool loop (GRPOTrainer._tool_call_loop) on a scripted episode: its generation replaced by the
# script's turns, its template and response parser bench/agent_trl.py's (the project's tool format as native
# tool turns). Prints the prompt ids, TRL's completion ids, tool mask and log-probs as JSON.
TRL_LOOP_SCRIPT = r'''
import json, sys
from types import SimpleNamespace
sys.path.insert(0, sys.argv[1])  # bench/
from agent_trl import calculator_tool, tool_tokenizer
from trl.chat_template_utils import parse_response
from trl.trainer.grpo_trainer import GRPOTrainer

x = json.load(sys.stdin)
tok, tool = tool_tokenizer(x["tok_dir"]), calculator_tool()
turns = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in x["turns"]]
prompt = [{"role": "user", "content": x["question"]}]
prompt_ids = tok.apply_chat_template(prompt, tools=[tool], add_generation_prompt=True, tokenize=True, return_dict=False)
t = object.__new__(GRPOTrainer)
later = iter(turns[1:])
t.__dict__.update(_sync_tool_dicts=[{"calculate": tool}], _async_tool_dicts=[{}], max_tool_calling_iterations=2,
                  use_vllm=False, model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=4096)),
                  max_completion_length=512, _is_vlm=False, tools=[tool], environment_factories=None, _tokenizer=tok,
                  processing_class=tok, chat_template=None, chat_template_kwargs={},
                  _generate_single_turn=lambda ids, *a, **k: ([next(later) for _ in ids], None))
first = parse_response(tok, turns[0], prefix=prompt_ids, tools=[tool])
mask, completions, completion_ids, logprobs, calls, failures, _ = t._tool_call_loop(
    [list(prompt)], [prompt_ids], [list(turns[0])], [[first]], None, None, None)
print(json.dumps({"prompt_ids": prompt_ids, "completion_ids": completion_ids[0], "tool_mask": mask[0],
                  "calls": calls, "failures": failures, "last": completions[0][-1]["content"]}))
'''


def test_trls_own_tool_loop_builds_our_episode_token_for_token(tmp_path):
    """The stronger parity check: TRL's own `_tool_call_loop` (its call parsing, tool execution and
    `_get_tool_suffix_ids`), given the same sampled turns, holds exactly our episode's ids and mask - with a
    template that renders our documented format as native tool turns (bench/agent_trl.py, which the TRL tool
    bench uses)."""
    from posttrain.models.io import load_tokenizer
    from posttrain.models.tokenizer import train_tokenizer

    train_tokenizer(TEXTS, 300, tmp_path)
    tok = load_tokenizer(tmp_path)
    stop = tok.eos_token_id
    layout = EpisodeLayout.check(tok, [stop])
    turns = [render_call("calculate", {"expression": "123 * 456"}), "The answer is 56088."]
    question = "What is 123 * 456?"
    (ep,) = run_episodes(Script(tok, stop, turns), layout, in_process(Calculator), [{}],
                         [[{"role": "user", "content": question}]], n=1,
                         limits=EpisodeLimits(max_turns=3, max_new_tokens=64), temperature=1.0, seed=0)
    env = {**os.environ, "PYTHONPATH": str(_trl_dir()), "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([str(ROOT / ".venv/bin/python"), "-c", TRL_LOOP_SCRIPT, str(ROOT / "bench")],
                       input=json.dumps({"tok_dir": str(tmp_path), "question": question, "turns": turns}), env=env,
                       check=False, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    theirs = json.loads(r.stdout.strip().splitlines()[-1])
    assert theirs["calls"] == 1 and theirs["failures"] == 0 and theirs["last"] == "The answer is 56088."
    assert theirs["prompt_ids"] == ep.prompt_ids  # the tools block TRL renders from tools= is ours
    assert theirs["completion_ids"] == ep.response_ids  # the call, the tool's result as appended, the answer
    assert theirs["tool_mask"] == ep.sampled and 0 in ep.sampled
