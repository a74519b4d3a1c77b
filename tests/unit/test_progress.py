"""Live progress without a terminal: lines paced by time (first, last, every progress_every_s), with rate and
ETA, from SFT's and RL's trackers and from eval's generation."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from posttrain.config import TrackingConfig
from posttrain.tracking.progress import Progress, duration


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_lines_are_paced_by_time_and_carry_rate_and_eta():
    clock = Clock()
    p = Progress(100, every_s=30.0, clock=clock)
    assert p.due(21)  # the first unit of work done here (a resumed run: 20 were done before): a line
    clock.t += 5
    assert p.stats(21) == "21/100 (21%)"  # no rate yet: start-up and skipped steps never count
    clock.t += 10
    assert not p.due(40)  # 10 s since the last line
    clock.t += 20.5
    assert p.due(40)  # 30.5 s since the last line
    assert p.stats(40) == "40/100 (40%), 0.623 step/s, ETA 1m36s"  # 19 steps in 30.5 s
    assert not p.due(41) and p.due(100)  # the last unit always gets a line


def test_log_every_adds_lines_by_step():
    p = Progress(50, log_every=10, every_s=1e9, clock=Clock())
    p.stats(1)
    assert [d for d in range(2, 51) if p.due(d)] == [10, 20, 30, 40, 50]


@pytest.mark.parametrize(("s", "text"), [(0.4, "0s"), (59.6, "1m00s"), (187, "3m07s"), (7500, "2h05m"),
                                         (float("inf"), "?")])
def test_duration(s, text):
    assert duration(s) == text


def test_sft_tracker_prints_the_first_and_last_step_of_a_fast_run_with_eta(tmp_path, capsys):
    from posttrain.tracking import Tracker

    t = Tracker(TrackingConfig(wandb=False), 0, "t", total=8, start=3)
    for step in range(3, 8):
        t.log(step, {"loss": 1.5, "lr": 1e-3})
    t.close()
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["step 3", "step 7"], lines
    assert lines[0] == "step 3: loss=1.5 lr=0.001 | 4/8 (50%)"
    assert re.fullmatch(r"step 7: loss=1\.5 lr=0\.001 \| 8/8 \(100%\), [0-9.e+]+ step/s, ETA 0s", lines[1]), lines


def test_generate_reports_each_batch():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, pad_token_id=0, eos_token_id=1, attn_implementation="sdpa")
    from posttrain.models.generate import generate

    calls = []
    out = generate(LlamaForCausalLM(cfg).eval(), [[3, 4], [5], [6, 7, 8]], max_new_tokens=3, temperature=1.0, n=2,
                   eos_id=1, pad_id=0, batch_size=4, on_batch=lambda done, total: calls.append((done, total)))
    assert len(out) == 6 and calls == [(4, 6), (6, 6)]


def test_eval_prints_progress_lines(capsys):
    from posttrain.eval.evaluate import _progress

    report = _progress("greedy")
    report(64, 500)
    report(128, 500)  # within PROGRESS_EVERY_S of the first line: quiet
    report(500, 500)
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["eval greedy", "eval greedy"]
    assert lines[0] == "eval greedy: 64/500 (13%)"
    assert lines[1].startswith("eval greedy: 500/500 (100%), ") and " sample/s, ETA 0s" in lines[1]
