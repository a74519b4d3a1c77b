"""Scheduled retraining: the pipeline on the newest data, then a gate that compares like with like.

    retrain_run_id(kickoff time) ─► plan ─► data_prep ─► start_model ─► sft (or the start model) ─► rl
        ─► promote: candidate AND current holder evaluated on the channel's pinned eval set ─► promoted / refused

Each night's run id is `nightly-<kickoff time>` (the launch plan passes it), so every artifact of that night
carries it. Data files are read afresh (by content), and `"model": {"artifact": "channel:production"}` with
`"sft": {"enabled": false}` in `overrides` continues from the channel's current model instead of from scratch.
The promote task's output says promoted or refused and why; every decision is a `decision` artifact
(`posttrain channels`). Launch plans live in workflows/launch_plans.py.
"""

from __future__ import annotations

import datetime

from flytekit import conditional, workflow

from tasks.data import data_prep
from tasks.model import given_model, start_model
from tasks.plan import plan
from tasks.promote import Promotion, promote, retrain_run_id
from tasks.rl import rl
from tasks.sft import sft


@workflow
def retrain(recipe: str = "tiny_cpu", overrides: str = "", channel: str = "production", min_accuracy: float = 0.5,
            tolerance: float = 0.0, kickoff_time: datetime.datetime | None = None, require_gain: bool = False
            ) -> Promotion:
    p = plan(recipe=recipe, overrides=overrides, run_id=retrain_run_id(kickoff_time=kickoff_time), workflow="retrain")
    d = data_prep(cfg=p.data, require_completions=p.sft.enabled, run_id=p.run_id)
    s = start_model(model=p.model, run_id=p.run_id)
    m = (conditional("retrain_sft_or_start_model").if_(p.sft_enabled.is_true())
         .then(sft(model=p.model, sft=p.sft, tracking=p.tracking, dataset=d.dataset, tokenizer=d.tokenizer,
                   start_model=s, run_id=p.run_id))
         .else_().then(given_model(start=s)))
    r = rl(rl=p.rl, reward=p.reward, placement=p.placement, model=p.model, tracking=p.tracking, start_model=m,
           dataset=d.dataset, run_id=p.run_id)
    return promote(channel=channel, model=r, dataset=d.dataset, eval=p.eval, reward=p.reward,
                   min_accuracy=min_accuracy, tolerance=tolerance, run_id=p.run_id, require_gain=require_gain)
