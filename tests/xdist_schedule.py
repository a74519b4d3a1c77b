"""`--dist loadfile` with each worker holding one test ahead of the one it runs, not xdist's two.

A worker runs a test only once it knows the next (pytest tears fixtures down by it), so it must hold one ahead.
xdist 3.8's scheduler hands a worker another whole file whenever it holds two or fewer pending tests, so the
worker that draws the 2-test agent_pipeline module (about 21 min) also draws the next file at once and runs it
after those 21 min, while the other worker has finished its queue and idles: make test's e2e stage measured
1,780 s against 1,471 s of tests on its busier worker (2026-12-01, clean clone of 39611b3). Here a worker takes
a file only when it holds at most one pending test, so each file goes to whichever worker frees first.
"""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling


class OneAheadLoadFile(LoadFileScheduling):
    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 1:
            return
        self._assign_work_unit(node)


def pytest_xdist_make_scheduler(config, log):
    """The scheduler for `--dist loadfile` (None leaves every other mode to xdist)."""
    if config.getvalue("dist") == "loadfile":
        return OneAheadLoadFile(config, log)
    return None
