"""Launch plans: scheduled retraining with an eval gate (register with `pyflyte register workflows/`)."""

from __future__ import annotations

from flytekit import CronSchedule, LaunchPlan

from workflows.retrain import retrain

nightly_retrain = LaunchPlan.get_or_create(
    workflow=retrain,
    name="posttrain_nightly_retrain",
    default_inputs={"recipe": "tiny_cpu", "overrides": "", "channel": "production", "min_accuracy": 0.5},
    schedule=CronSchedule(schedule="0 3 * * *"),
)
"""Every night at 03:00 UTC: retrain from the current data files and promote only if the gate passes."""
