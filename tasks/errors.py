"""A user error's message first, on one line naming the stage.

pyflyte prints its own boxed traceback for whatever a task raises (flytekit's CLI has no switch to leave it
out), so each task prints `<stage>: error: <message>` before it re-raises a user error - a bad setting, bad
data, a missing artifact or file, a promotion that cannot be judged (posttrain.cli.main.USER_ERRORS). Anything else
is a bug and keeps just its traceback. The `posttrain` CLI prints the line alone (`--debug`: the traceback).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def stage_errors(stage: str) -> Iterator[None]:
    from posttrain.cli.main import USER_ERRORS

    try:
        yield
    except USER_ERRORS as e:
        if os.environ.get("RANK", "0") == "0":  # SPMD ranks fail alike: one line, not one per rank
            print(f"{stage}: error: {e}", flush=True)
        raise
