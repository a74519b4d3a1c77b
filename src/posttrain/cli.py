"""The `posttrain` console command: evaluate a model you already have, and inspect the artifact store.

    posttrain [--home ROOT] eval [--recipe R] [--overrides JSON] [--model PATH_OR_ARTIFACT_ID] [--json]
    posttrain [--home ROOT] artifacts list [--kind K] [--run R] [--json]
    posttrain [--home ROOT] lineage ID [--json]
    posttrain [--home ROOT] verify ID
    posttrain [--home ROOT] index rebuild

`eval` is `workflows/pipeline.py eval_pipeline` without Flyte: plain Python calling `posttrain.stages`
(data prep -> start model -> evaluate) in this process, with the same recipe and overrides as the pipeline
and the same stage caches. `--model` is a shorthand: a folder sets `model.base_path`, anything else
`model.artifact` (an id or unique prefix in the store); either way `data.tokenizer.train` becomes false (the
model brings its own tokenizer). Greedy accuracy always; sampled accuracy and pass@k only with `eval.k` > 0.
It prints the eval line and the `eval` artifact id (`--json`: one JSON object on stdout, progress on stderr).
What it leaves out: training, and placing the work on a cluster (use the workflows for that).

A user error - a bad setting (`ConfigError`, including `RewardFunctionError`), bad input data
(`DataValidationError`), a missing artifact or file - prints one line, `posttrain: error: ...`, and exits
with status 1; `--debug` (before or after the command) shows the traceback instead. Output into a pipe
whose reader stops early (`posttrain artifacts list | head`) ends quietly with status 141.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from posttrain.artifacts import ArtifactStore
from posttrain.artifacts.cli import add_commands, add_debug_flag, run_command, stdout_closed
from posttrain.artifacts.errors import ArtifactError
from posttrain.config import ConfigError
from posttrain.data.validation import DataValidationError

USER_ERRORS = (ConfigError, DataValidationError, ArtifactError, FileNotFoundError)
"""Errors in what the user gave (settings, reward function, data, artifact ids, paths): `posttrain eval`
prints their message alone; anything else is a bug and keeps its traceback."""


def with_model(overrides: dict, model: str) -> dict:
    """`overrides` with `--model` applied: a folder is `model.base_path`, anything else `model.artifact`."""
    is_dir = os.path.isdir(os.path.expanduser(model))
    m = {"base_path": os.path.abspath(os.path.expanduser(model)) if is_dir else "", "artifact": "" if is_dir else model}
    data = overrides.get("data", {})
    tokenizer = data.get("tokenizer", {}) if isinstance(data, dict) else {}
    return {**overrides, "model": {**overrides.get("model", {}), **m},
            "data": {**data, "tokenizer": {**tokenizer, "train": False}}}


def evaluate_model(*, recipe: str, overrides: str, model: str | None, run_id: str, store: ArtifactStore) -> dict:
    """Data prep, start model, evaluation; returns the ids and the eval artifact's metrics."""
    from posttrain import stages
    from posttrain.recipes import resolve
    from posttrain.runtime import new_run_id

    try:
        over = json.loads(overrides) if overrides.strip() else {}
    except json.JSONDecodeError as e:
        raise ConfigError(f"--overrides: not valid JSON ({e})") from None
    if not isinstance(over, dict):
        raise ConfigError(f"--overrides: expected a JSON object, got {type(over).__name__}")
    cfg = resolve(recipe, with_model(over, model) if model else over)
    if not (cfg.model.base_path or cfg.model.artifact):
        raise ConfigError("model: nothing to evaluate; give --model PATH_OR_ARTIFACT_ID (or set model.base_path / "
                          "model.artifact in --overrides)")
    run_id = run_id or new_run_id()
    start = stages.start_model(cfg.model, run_id=run_id, store=store)
    data = stages.data_prep(cfg.data, require_completions=False, run_id=run_id, store=store)
    out = stages.evaluate(cfg.eval, cfg.reward, model=start, dataset=data.dataset, run_id=run_id, store=store)
    return {"run_id": run_id, "eval_id": out.report.id, "model_id": start.id, "dataset_id": data.dataset.id,
            "store": store.root, "metrics": store.manifest(out.report.id).metrics}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="posttrain", description=__doc__.split("\n")[0])
    ap.add_argument("--home", help="store root (default: $POSTTRAIN_HOME or ~/.posttrain)")
    add_debug_flag(ap, top=True)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ev = sub.add_parser("eval", help="evaluate one model on a dataset's eval split (no Flyte needed)")
    ev.add_argument("--recipe", default="tiny_cpu", help="recipe name (src/posttrain/recipes.py)")
    ev.add_argument("--overrides", default="", help="JSON overrides, as for the pipeline")
    ev.add_argument("--model", help="a local HF model folder, or a model artifact id (or unique prefix)")
    ev.add_argument("--run-id", default="", help="run id recorded in the eval manifest (default: a new one)")
    ev.add_argument("--json", action="store_true", help="print one JSON object (progress goes to stderr)")
    add_debug_flag(ev, top=False)
    add_commands(sub)
    args = ap.parse_args(argv)
    if args.cmd != "eval":
        return run_command(args)
    try:
        store = ArtifactStore(args.home)
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
            result = evaluate_model(recipe=args.recipe, overrides=args.overrides, model=args.model,
                                    run_id=args.run_id, store=store)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"eval artifact {result['eval_id']}  (lineage: posttrain lineage {result['eval_id'][:12]})")
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's final flush
    except BrokenPipeError:
        return stdout_closed()
    except USER_ERRORS as e:
        if args.debug:
            raise
        print(f"posttrain: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
