"""Moved: the store's commands are `posttrain.cli.store` (`posttrain runs`, `posttrain lineage ID`, ... or
`python -m posttrain.cli.store ...`). Run by its old name, this says so and exits with status 1."""

import sys

MOVED = ("posttrain.artifacts.cli moved to posttrain.cli.store: run `posttrain <command>` or "
         "`python -m posttrain.cli.store <command>`")

if __name__ == "__main__":
    sys.exit(f"posttrain: error: {MOVED}")
