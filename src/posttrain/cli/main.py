"""The `posttrain` console command: evaluate a model you already have, inspect the artifact store, promote.

    posttrain [--home ROOT] eval [--recipe R] [--overrides JSON] [--model PATH_OR_ARTIFACT_ID] [--json]
    posttrain [--home ROOT] artifacts list [--kind K] [--run R] [--json]
    posttrain [--home ROOT] runs [--limit N] [--json]
    posttrain [--home ROOT] show ID [--json]
    posttrain [--home ROOT] lineage ID [--json]
    posttrain [--home ROOT] verify ID
    posttrain [--home ROOT] index rebuild
    posttrain [--home ROOT] export ID DIR
    posttrain [--home ROOT] channels [--json]
    posttrain [--home ROOT] promote MODEL CHANNEL [--pin DATASET [--guard DATASET]...] [--recipe R]
                                   [--overrides JSON] [--min-accuracy X] [--tolerance T] [--require-gain] [--json]

`eval` is `workflows/pipeline.py eval_pipeline` without Flyte: plain Python calling `posttrain.stages`
(data prep -> start model -> evaluate) in this process, with the same recipe and overrides as the pipeline
and the same stage caches. `--model` is a shorthand: a folder sets `model.base_path`, anything else
`model.artifact` (an id or unique prefix in the store); either way `data.tokenizer.train` becomes false (the
model brings its own tokenizer). Greedy accuracy always; sampled accuracy and pass@k only with `eval.k` > 0.
It prints the eval line and the `eval` artifact id (`--json`: one JSON object on stdout, progress on stderr).
What it leaves out: training, and placing the work on a cluster (use the workflows for that).

`export` writes a model (or reward model) artifact as a plain HF folder at DIR (which must not exist or be empty):
the artifact's own files, or for an adapter artifact (trained with `model.lora`) its base with the adapter merged
in - a folder transformers 5.x and 4.57 load unchanged, with no peft needed.

`channels` prints each channel's holder and its decision history, newest first. `promote` runs the same gate
as the retrain workflow (`posttrain.stages.gate.judge`: MODEL and the channel's current model evaluated on the
channel's pinned eval set with the recipe's eval settings): it prints `promoted: REASON` and exits 0, or
`refused: REASON` and exits with status 3 (REFUSED_STATUS), so a script cannot take a refusal for success.

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
from posttrain.artifacts.errors import ArtifactError
from posttrain.artifacts.run_ids import new_run_id
from posttrain.cli.store import add_commands, add_debug_flag, run_command, stdout_closed
from posttrain.config import ConfigError
from posttrain.data.validation import DataValidationError
from posttrain.promotion import PromotionError, channels, current, decisions_by_channel

USER_ERRORS = (ConfigError, DataValidationError, ArtifactError, FileNotFoundError, PromotionError)
"""Errors in what the user gave (settings, reward function, data, artifact ids, paths, a model and eval that do
not belong together): `posttrain eval`, `channels` and `promote` print their message alone; anything else is a
bug and keeps its traceback."""

REFUSED_STATUS = 3
"""`posttrain promote`'s exit status when the gate refused the model (1 is an error, 0 a promotion)."""


def with_model(overrides: dict, model: str) -> dict:
    """`overrides` with `--model` applied: a folder is `model.base_path`, anything else `model.artifact`."""
    is_dir = os.path.isdir(os.path.expanduser(model))
    m = {"base_path": os.path.abspath(os.path.expanduser(model)) if is_dir else "", "artifact": "" if is_dir else model}
    data = overrides.get("data", {})
    tokenizer = data.get("tokenizer", {}) if isinstance(data, dict) else {}
    return {**overrides, "model": {**overrides.get("model", {}), **m},
            "data": {**data, "tokenizer": {**tokenizer, "train": False}}}


def _overrides(text: str) -> dict:
    try:
        over = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise ConfigError(f"--overrides: not valid JSON ({e})") from None
    if not isinstance(over, dict):
        raise ConfigError(f"--overrides: expected a JSON object, got {type(over).__name__}")
    return over


def evaluate_model(*, recipe: str, overrides: str, model: str | None, run_id: str, store: ArtifactStore) -> dict:
    """Data prep, start model, evaluation; returns the ids and the eval artifact's metrics."""
    from posttrain import stages
    from posttrain.recipes import resolve

    over = _overrides(overrides)
    cfg = resolve(recipe, with_model(over, model) if model else over)
    if not (cfg.model.base_path or cfg.model.artifact):
        raise ConfigError("model: nothing to evaluate; give --model PATH_OR_ARTIFACT_ID (or set model.base_path / "
                          "model.artifact in --overrides)")
    run_id = run_id or new_run_id()
    start = stages.start_model(cfg.model, run_id=run_id, store=store)
    data = stages.data_prep(cfg.data, require_completions=False, run_id=run_id, store=store)
    out = stages.evaluate(cfg.eval, cfg.reward, model=start, dataset=data.dataset, run_id=run_id, store=store,
                          tracking=cfg.tracking)
    return {"run_id": run_id, "eval_id": out.report.id, "model_id": start.id, "dataset_id": data.dataset.id,
            "store": store.root, "metrics": store.manifest(out.report.id).metrics}


def run_eval(args: argparse.Namespace, store: ArtifactStore) -> int:
    """`posttrain eval`: progress on stdout, or on stderr with --json so stdout holds one JSON object."""
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        result = evaluate_model(recipe=args.recipe, overrides=args.overrides, model=args.model,
                                run_id=args.run_id, store=store)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"eval artifact {result['eval_id']}  (lineage: posttrain lineage {result['eval_id'][:12]})")
    return 0


def render_channel(name: str, holder: dict | None, history: list[dict]) -> list[str]:
    """A channel as text: its holder, then one line per decision, newest first."""
    head = (f"{name}  model {holder['model_id'][:12]}  eval {holder['eval_id'][:12]}  "
            f"greedy {holder['greedy_accuracy']:.3f}" if holder else f"{name}  (no holder)")
    return [head] + [f"  {d['time']}  {'promoted' if d['promoted'] else 'refused ':<8}  model {d['model_id'][:12]}"
                     f"  greedy {d['greedy_accuracy']:.3f}{_change(d)}  {d['reason']}" for d in history]


def _change(decision: dict) -> str:
    """The paired change over the holder on the pinned set, with its 95% interval ("" when not recorded)."""
    c = (decision.get("paired_changes") or [None])[0]
    return f"  change {c['change']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]" if c else ""


def run_channels(args: argparse.Namespace, store: ArtifactStore) -> int:
    """`posttrain channels`: every channel's holder and decision history."""
    decided = decisions_by_channel(store)
    rows = [{"channel": c, "holder": current(c, store), "decisions": decided.get(c, [])} for c in channels(store)]
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:  # no channel prints nothing, as an empty `artifacts list` does
        print("\n\n".join("\n".join(render_channel(r["channel"], r["holder"], r["decisions"])) for r in rows))
    return 0


def run_promote(args: argparse.Namespace, store: ArtifactStore) -> int:
    """`posttrain promote`: the retrain workflow's gate by hand - MODEL and the channel's current holder are
    evaluated on the channel's pinned eval set with the recipe's eval settings; exit status 0 promoted,
    REFUSED_STATUS refused."""
    from posttrain.recipes import resolve
    from posttrain.stages.gate import judge

    cfg = resolve(args.recipe, args.overrides)
    model = store.ref(args.model)
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        d = judge(channel=args.channel, model=model, pin_to=store.ref(args.pin) if args.pin else None,
                  explicit_pin=bool(args.pin), guards=tuple(store.ref(g) for g in args.guard), eval_cfg=cfg.eval, reward=cfg.reward,
                  min_accuracy=args.min_accuracy, tolerance=args.tolerance, run_id=args.run_id or new_run_id(),
                  store=store, require_gain=args.require_gain)
    if args.json:
        print(json.dumps({"channel": args.channel, "model_id": model.id, "promoted": d.promoted,
                          "reason": d.reason, "decision_id": d.decision_id}, indent=2))
    else:
        print(f"{'promoted' if d.promoted else 'refused'}: {d.reason}")
    return 0 if d.promoted else REFUSED_STATUS


def run_export(args: argparse.Namespace, store: ArtifactStore) -> int:
    """`posttrain export ID DIR`: the model as a full HF folder (merged when it is an adapter)."""
    import shutil
    import tempfile
    from pathlib import Path

    from posttrain.models.folders import model_folder

    ref = store.ref(args.id)
    if ref.kind not in ("model", "reward_model"):
        raise ConfigError(f"export: {args.id!r} is a {ref.kind} artifact ({ref.short} {ref.name}), not a model")
    out = Path(args.dir).expanduser().absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"export: {out} exists and is not an empty folder; name a new one")
    src = model_folder(store, ref)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:  # complete or absent: copied beside DIR, then renamed into place
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    merged = src != store.get(ref)
    print(f"exported {ref.kind} {ref.short} ({ref.name}) to {out}"
          + (f" (LoRA adapter merged into base {store.manifest(ref).extra['adapter_of'][:12]})" if merged else ""))
    return 0


COMMANDS = {"eval": run_eval, "export": run_export, "channels": run_channels, "promote": run_promote}
"""The commands this module runs itself; the store's (cli/store.py) run through `run_command`."""


def add_own_commands(sub) -> None:
    """The `eval`, `channels` and `promote` subcommands, added to an argparse subparsers object."""
    ev = sub.add_parser("eval", help="evaluate one model on a dataset's eval split (no Flyte needed)")
    ev.add_argument("--recipe", default="tiny_cpu", help="recipe name (src/posttrain/recipes/)")
    ev.add_argument("--overrides", default="", help="JSON overrides, as for the pipeline")
    ev.add_argument("--model", help="a local HF model folder, or a model artifact id (or unique prefix)")
    ev.add_argument("--run-id", default="", help="run id recorded in the eval manifest (default: a new one)")
    ev.add_argument("--json", action="store_true", help="print one JSON object (progress goes to stderr)")
    ex = sub.add_parser("export", help="write a model artifact as a plain HF folder (an adapter merged into its base)")
    ex.add_argument("id", help="model artifact id or unique prefix")
    ex.add_argument("dir", help="a new (or empty) folder to write the model into")
    ch = sub.add_parser("channels", help="each channel's current model and its promotion decisions")
    ch.add_argument("--json", action="store_true", help="print JSON instead of text")
    pr = sub.add_parser(
        "promote", help="judge a model against a channel's current one on the channel's pinned eval set",
        description="Evaluate MODEL and CHANNEL's current model on the channel's pinned eval set (and guard sets) "
                    "with the recipe's eval settings; promote MODEL when its greedy accuracy reaches "
                    "--min-accuracy and is nowhere below the holder's by more than --tolerance. Every decision "
                    "is stored as a `decision` artifact (see `posttrain channels`).",
        epilog=f"exit status: 0 promoted, {REFUSED_STATUS} refused by the gate, 1 an error (a bad id, a channel "
               f"with no pinned eval set and no --pin)")
    pr.add_argument("model", help="model artifact id or unique prefix")
    pr.add_argument("channel", help="channel name, e.g. production")
    pr.add_argument("--pin", default="", help="dataset artifact whose eval split the channel is judged on from "
                                              "now on (only for a channel that pins none yet)")
    pr.add_argument("--guard", action="append", default=[], help="extra dataset the candidate must not get worse "
                                                                 "on (with --pin; repeatable)")
    pr.add_argument("--recipe", default="tiny_cpu", help="recipe whose eval settings both models are evaluated with")
    pr.add_argument("--overrides", default="", help="JSON overrides of the recipe, e.g. '{\"eval\": {\"k\": 0}}'")
    pr.add_argument("--min-accuracy", type=float, default=0.0,
                    help="lowest greedy accuracy on the pinned set to promote (default 0)")
    pr.add_argument("--tolerance", type=float, default=0.0,
                    help="how far below the holder's accuracy the candidate may be on any set (default 0)")
    pr.add_argument("--require-gain", action="store_true",
                    help="promote only when the candidate's problem-by-problem change over the holder on the pinned "
                         "set has a 95%% interval above 0 (a gain that is not noise)")
    pr.add_argument("--run-id", default="", help="run id recorded in the evaluations and the decision")
    pr.add_argument("--json", action="store_true", help="print one JSON object (progress goes to stderr)")
    for p in (ev, ex, ch, pr):
        add_debug_flag(p, top=False)


def parser() -> argparse.ArgumentParser:
    """The whole command line (docs/cli.md, the CLI reference, is generated from it by docs/cli_reference.py)."""
    ap = argparse.ArgumentParser(prog="posttrain", description=__doc__.split("\n")[0])
    ap.add_argument("--home", help="store root (default: $POSTTRAIN_HOME or ~/.posttrain)")
    add_debug_flag(ap, top=True)
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_own_commands(sub)
    add_commands(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.cmd not in COMMANDS:
        return run_command(args)
    try:
        status = COMMANDS[args.cmd](args, ArtifactStore(args.home))
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's final flush
    except BrokenPipeError:
        return stdout_closed()
    except USER_ERRORS as e:
        if args.debug:
            raise
        print(f"posttrain: error: {e}", file=sys.stderr)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
