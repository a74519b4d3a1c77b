"""Two evaluations of the same problems compared problem by problem: the change in greedy accuracy with its 95%
interval and McNemar's exact p-value (posttrain.eval.intervals.paired_change), so a gain can be told from noise.
Paired, not two independent intervals: both models answered the same problems, and most of each model's
right and wrong answers are shared, so the change is far better determined than either accuracy.

    paired_greedy(after_report, before_report) -> PairedChange | None
    change_over_start(store, eval_manifest) -> (start model's eval manifest, PairedChange) | None
"""

from __future__ import annotations

from posttrain.artifacts import ArtifactStore
from posttrain.artifacts.manifest import Manifest
from posttrain.eval.intervals import PairedChange, paired_change
from posttrain.eval.report import EvalReport


def paired_greedy(after: EvalReport, before: EvalReport) -> PairedChange | None:
    """The greedy change from `before` to `after`; None when either report keeps no per-problem results (written
    before they were kept) or they did not score the same problems in the same order (prompt and answer)."""
    if not after.problems or not before.problems:
        return None
    if [(p.get("prompt"), p.get("answer")) for p in after.problems] != \
            [(p.get("prompt"), p.get("answer")) for p in before.problems]:
        return None
    return paired_change([bool(p["correct"]) for p in after.problems], [bool(p["correct"]) for p in before.problems])


def report_of(store: ArtifactStore, eval_id: str) -> EvalReport:
    """The report an eval artifact holds."""
    return EvalReport.from_json((store.get(eval_id) / "report.json").read_text())


def start_eval(store: ArtifactStore, ev: Manifest) -> Manifest | None:
    """The newest eval of this eval's model's start model on the same dataset, if the store holds one."""
    start = store.manifest(ev.config["model_id"]).extra.get("start_model") if ev.config.get("model_id") else None
    found = [e for e in store.list(kind="eval", child_of=start)
             if e.config.get("dataset_id") == ev.config.get("dataset_id")] if start else []
    return max(found, key=lambda e: e.created) if found else None


def change_over_start(store: ArtifactStore, ev: Manifest) -> tuple[Manifest, PairedChange] | None:
    """An eval's greedy change over its model's start model, problem by problem on the same dataset, with the
    start model's eval; None when the store holds no such eval or the two did not keep the same problems."""
    start = start_eval(store, ev)
    paired = paired_greedy(report_of(store, ev.id), report_of(store, start.id)) if start is not None else None
    return (start, paired) if paired is not None else None
