"""Run ids: one per pipeline run, recorded in every manifest (local Flyte executions are all "local")."""

from __future__ import annotations

import datetime
import secrets


def new_run_id() -> str:
    """A sortable, unique run id such as "20261122-101502-3f9a1c"."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{now}-{secrets.token_hex(3)}"
