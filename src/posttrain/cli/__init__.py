"""The `posttrain` console command (`posttrain.cli.main:main`): its own commands (main.py: eval, channels, promote)
and the artifact store's (store.py: runs, lineage, artifacts, verify, ...; also `python -m posttrain.cli.store`).
Nothing is imported here, so running store.py as a module does not import it twice."""
