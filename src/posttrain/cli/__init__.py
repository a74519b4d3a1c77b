"""The `posttrain` console command: its own commands (main.py: eval, channels, promote) and the artifact store's
(store.py: runs, lineage, artifacts, verify, ...)."""

from posttrain.cli.main import REFUSED_STATUS, USER_ERRORS, main

__all__ = ["REFUSED_STATUS", "USER_ERRORS", "main"]
