"""Launch plans: scheduled retraining with an eval gate (register with `pyflyte register workflows/`)."""

from __future__ import annotations

from flytekit import CronSchedule, LaunchPlan

from workflows.retrain import retrain

nightly_retrain = LaunchPlan.get_or_create(
    workflow=retrain,
    name="posttrain_nightly_retrain",
    default_inputs={"recipe": "tiny_cpu", "overrides": "", "channel": "production", "min_accuracy": 0.5,
                    "tolerance": 0.0},
    schedule=CronSchedule(schedule="0 3 * * *", kickoff_time_input_arg="kickoff_time"),
)
"""Every night at 03:00 UTC: retrain on the current data files; the kickoff time becomes the run id
(`nightly-YYYYmmddTHHMMSSZ`); promoted only if the gate passes on the channel's pinned eval set."""
