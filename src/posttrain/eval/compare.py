"""Two evaluations of the same problems compared problem by problem: the change in greedy accuracy with its 95%
interval and McNemar's exact p-value (posttrain.eval.intervals.paired_change), so a gain can be told from noise.
Paired, not two independent intervals: both models answered the same problems, and most of each model's
right and wrong answers are shared, so the change is far better determined than either accuracy.

    paired_greedy(after_report, before_report) -> PairedChange | None
"""

from __future__ import annotations

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
