"""Scheduled retraining: the full pipeline, then an evaluation gate before promotion.

    plan ─► data_prep ─► sft ─► rl ─► evaluate ─► gate ─► promoted? (channel pointer in the store)

The gate promotes the RL model to a named channel (e.g. "production") only if its greedy accuracy reaches
`min_accuracy` AND is not worse than the model the channel currently points to. Launch plans with cron
schedules live in workflows/launch_plans.py.
"""

from __future__ import annotations

from flytekit import workflow

from tasks.data import data_prep
from tasks.evaluate import evaluate
from tasks.plan import plan
from tasks.promote import Promotion, promote
from tasks.rl import rl
from tasks.sft import sft


@workflow
def retrain(recipe: str = "tiny_cpu", overrides: str = "", channel: str = "production",
            min_accuracy: float = 0.5) -> Promotion:
    p = plan(recipe=recipe, overrides=overrides, run_id="")
    d = data_prep(cfg=p.data, require_completions=p.sft.enabled, run_id=p.run_id)
    m = sft(model=p.model, sft=p.sft, tracking=p.tracking, dataset=d.dataset, tokenizer=d.tokenizer,
            run_id=p.run_id)
    r = rl(rl=p.rl, reward=p.reward, placement=p.placement, model=p.model,
           tracking=p.tracking, start_model=m, dataset=d.dataset, run_id=p.run_id)
    e = evaluate(cfg=p.eval, reward=p.reward, model=r, dataset=d.dataset, run_id=p.run_id)
    return promote(channel=channel, model=r, eval_report=e.report, min_accuracy=min_accuracy)
