"""The store's commands: list artifacts and runs, show one artifact or its lineage, verify files, rebuild the index.

The `posttrain` console command (posttrain/cli/main.py) adds these to its own (`eval`, `channels`, `promote`); this
module runs alone too (`python -m posttrain.cli.store`); it imports the artifact store (and the report pages, for
`show --html`).

    posttrain [--home ROOT] artifacts list [--kind K] [--run R] [--json]
    posttrain [--home ROOT] runs [--limit N] [--json]
    posttrain [--home ROOT] show ID [--json] [--html FILE]
    posttrain [--home ROOT] lineage ID [--json]
    posttrain [--home ROOT] verify ID
    posttrain [--home ROOT] index rebuild

Errors print one line, `posttrain: error: ...`, with exit status 1; `--debug` (before or after the command)
shows the traceback instead. Output into a pipe whose reader stops early (`posttrain artifacts list | head`)
ends quietly with status 141, as a command killed by SIGPIPE does.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from posttrain.artifacts.errors import ArtifactError, ArtifactNotFoundError
from posttrain.artifacts.manifest import Manifest
from posttrain.artifacts.store import ArtifactStore, LineageNode
from posttrain.eval.compare import change_over_start
from posttrain.tracking.progress import duration


def _key_config(m) -> dict:
    flat = {}
    for k, v in m.config.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                if isinstance(v2, (int, float, str, bool)) and k2 in _KEYS:
                    flat[f"{k}.{k2}"] = v2
        elif isinstance(v, (int, float, str, bool)) and k in _KEYS:
            flat[k] = v
    return flat


_KEYS = {"task", "num_digits", "num_examples", "vocab_size", "steps", "lr", "hidden_size", "num_layers",
         "samples_per_prompt", "kl_coef", "num_problems", "k", "temperature", "nproc", "algorithm", "beta"}


def render_lineage(node: LineageNode, indent: str = "") -> list[str]:
    m = node.manifest
    metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in m.metrics.items() if isinstance(v, (int, float)))
    cfg = ", ".join(f"{k}={v}" for k, v in _key_config(m).items())
    lines = [f"{indent}{m.kind:<9} {m.id[:12]}  {m.name}  (run {m.run_id}, {m.created})"]
    if cfg:
        lines.append(f"{indent}          config: {cfg}")
    if metrics:
        lines.append(f"{indent}          metrics: {metrics}")
    for p in node.parents:
        lines.extend(render_lineage(p, indent + "    "))
    return lines


def _tree_json(node: LineageNode) -> dict:
    m = node.manifest
    return {"kind": m.kind, "id": m.id, "name": m.name, "run_id": m.run_id, "config": m.config,
            "metrics": m.metrics, "extra": m.extra, "parents": [_tree_json(p) for p in node.parents]}


# ------------------------------------------------------------------------------------- runs and show

STAGE_ORDER = ("dataset", "tokenizer", "base", "model", "sft", "pairs", "dpo", "reward_model", "distill",
               "pass_rate", "rl", "eval", "eval_pairs", "decision")
"""Pipeline order: it breaks ties between artifacts created in the same second."""

TRAINED = ("rl", "dpo", "reward_model", "distill", "sft")
"""Training stages, last in a pipeline first: a run's final model is of the first of these it holds."""

HEADLINE = ("greedy_accuracy", "sampled_accuracy", "pass_at_k", "num_problems")
"""An eval's key metrics (sampled accuracy and pass@k exist only with eval.k > 0)."""

KEY_METRICS = {"eval": HEADLINE, "eval_pairs": ("pairwise_accuracy", "num_pairs", "margin_mean"),
               "sft": ("loss",), "dpo": ("loss", "accuracy", "rewards/margin"), "reward_model": ("loss", "accuracy"),
               "distill": ("loss", "ce"), "pairs": ("num_train", "num_eval", "all_correct", "all_wrong"),
               "pass_rate": ("num_train", "sampled", "never_solved", "always_solved")}
"""Per stage, the metrics `runs` lists beside the artifact (a trainer's are its last step's: `accuracy` is DPO's
preference accuracy or a reward model's, on the last batch)."""

_ROLES = {"dpo": ("frozen_model", "reference"), "distill": ("frozen_model", "teacher"),
          "pairs": ("source_model", "source")}
"""Per stage, the manifest extra naming the other model it used and what that model was to it."""


def _roles(m: Manifest) -> dict[str, str]:
    """{role: model id} of the model a stage used besides its start model: DPO's reference, the distillation
    teacher, the model whose samples made a pairs dataset."""
    key, role = _ROLES.get(m.stage, (None, None))
    return {role: m.extra[key]} if key and m.extra.get(key) else {}


def _entry(m: Manifest, by_id: dict[str, Manifest]) -> dict:
    """One artifact of a run: its stage, ids, its key metrics, and for an eval the model it scored."""
    e = {"stage": m.stage, "id": m.id, "kind": m.kind, "name": m.name, "created": m.created}
    if m.kind == "eval":
        model = next((by_id[p] for p in m.parents if p in by_id and by_id[p].kind in ("model", "reward_model")), None)
        e.update(model_id=model.id if model else None, model_stage=model.stage if model else None)
    if m.stage in KEY_METRICS:
        e["metrics"] = {k: m.metrics[k] for k in KEY_METRICS[m.stage] if k in m.metrics}
    return e


def _rank(s: str) -> int:
    return STAGE_ORDER.index(s if s in STAGE_ORDER else "model")


def _order(e: dict) -> tuple:
    """Creation time, then pipeline order (an eval right after the stage of the model it scored)."""
    scored = e["stage"] in ("eval", "eval_pairs")
    rank = _rank(e.get("model_stage") or e["stage"]) + 0.5 if scored else _rank(e["stage"])
    return e["created"], rank


def run_status(arts: list[dict]) -> str:
    """The run's status: "complete" when its last training stage has a model and that model an eval in the run: an RL
    model with an eval of it, else a DPO, reward or distilled model with an eval of it (a reward model's is its
    pairwise eval), else an SFT model with an eval of it; a run that trained nothing (`posttrain eval`) is
    complete once it has an eval. Otherwise "partial (last stage: S)", S being
    the stage of the run's newest artifact. A stage served from the cache stored nothing in this run (its
    artifact belongs to the run that made it first), so it counts for that run, not this one."""
    stages = {a["stage"] for a in arts}
    final = next((s for s in TRAINED if s in stages), None)
    evaluated = {a["model_id"] for a in arts if a["stage"] in ("eval", "eval_pairs")}
    done = any(a["id"] in evaluated for a in arts if a["stage"] == final) if final else bool(evaluated)
    return "complete" if done else f"partial (last stage: {_label(arts[-1])})"


def _label(e: dict) -> str:
    return f"eval({e['model_stage']})" if e["stage"] == "eval" and e.get("model_stage") else e["stage"]


def runs(store: ArtifactStore) -> list[dict]:
    """Every run in the store (its manifests grouped by run id), newest first (by the first artifact's time)."""
    manifests = store.list()
    by_id = {m.id: m for m in manifests}
    grouped: dict[str, list[dict]] = defaultdict(list)
    for m in manifests:
        e = _entry(m, by_id)
        if m.kind == "eval" and m.stage == "eval":
            e["change_over_start"] = _change_over_start(store, m)
        grouped[m.run_id].append(e)
    out = [_run(run_id, sorted(arts, key=_order)) for run_id, arts in grouped.items()]
    return sorted(out, key=lambda r: (r["first_created"], r["run_id"]), reverse=True)


def _change_over_start(store: ArtifactStore, m: Manifest) -> dict | None:
    """An eval's paired greedy change over its model's start model on the same problems, with its 95% interval
    and McNemar's p (posttrain.eval.compare); None without such an eval in the store."""
    found = change_over_start(store, m)
    if found is None:
        return None
    start, c = found
    return {"start_eval_id": start.id, "change": c.change, "low": c.low, "high": c.high, "p_value": c.p_value,
            "gained": c.gained, "lost": c.lost, "num_problems": c.n}


def _run(run_id: str, arts: list[dict]) -> dict:
    first, last = arts[0]["created"], max(a["created"] for a in arts)
    wall = datetime.datetime.fromisoformat(last) - datetime.datetime.fromisoformat(first)
    return {"run_id": run_id, "status": run_status(arts), "first_created": first, "last_created": last,
            "wall_s": wall.total_seconds(), "artifacts": arts}


def _fmt(x) -> str:
    """A metric for the console: floats to 4 significant digits, "n/a" for a missing one."""
    return "n/a" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def _headline(metrics: dict) -> str:
    return (f"greedy {_fmt(metrics.get('greedy_accuracy'))}  sampled {_fmt(metrics.get('sampled_accuracy'))}"
            f"  pass@k {_fmt(metrics.get('pass_at_k'))}  on {_fmt(metrics.get('num_problems'))} problems")


def _summary(stage: str, metrics: dict) -> str:
    """A stage's key metrics in words ("" for a stage without any): an eval's accuracies, a reward model eval's
    pairwise accuracy, a trainer's final loss (and DPO's preference accuracy, a reward model's accuracy, a
    distilled model's cross-entropy), a pairs dataset's counts, a pass-rate selection's."""
    g = metrics.get
    if stage == "eval":
        return _headline(metrics)
    if stage == "eval_pairs":
        return (f"pairwise accuracy {_fmt(g('pairwise_accuracy'))} on {_fmt(g('num_pairs'))} pairs"
                f"  margin {_fmt(g('margin_mean'))}")
    if stage == "pairs":
        return (f"{_fmt(g('num_train'))} train / {_fmt(g('num_eval'))} eval pairs  (prompts all correct "
                f"{_fmt(g('all_correct'))}, all wrong {_fmt(g('all_wrong'))})")
    if stage == "pass_rate":
        return (f"{_fmt(g('num_train'))} of {_fmt(g('sampled'))} train prompts kept  (never solved "
                f"{_fmt(g('never_solved'))}, always {_fmt(g('always_solved'))})")
    if stage in ("sft", "dpo", "reward_model", "distill") and "loss" in metrics:
        extra = {"dpo": ("preference accuracy", "accuracy"), "reward_model": ("accuracy", "accuracy"),
                 "distill": ("ce", "ce")}.get(stage)
        return f"final loss {_fmt(g('loss'))}" + (f"  {extra[0]} {_fmt(g(extra[1]))}" if extra else "")
    return ""


def render_run(run: dict) -> list[str]:
    """A run as text: one line for the run, one per artifact; RL checkpoints collapse into the last one."""
    arts = run["artifacts"]
    rl = [a for a in arts if a["stage"] == "rl"]
    head = (f"run {run['run_id']}  {run['status']}  {run['first_created']}  wall {duration(run['wall_s'])}"
            f"  ({len(arts)} artifacts)")
    lines = [head]
    for a in arts:
        if a["stage"] == "rl" and a is not rl[-1]:
            continue
        note = (f"({len(rl)} checkpoints)" if a["stage"] == "rl" and len(rl) > 1 else
                _summary(a["stage"], a.get("metrics", {})))
        if c := a.get("change_over_start"):
            note += (f"  greedy change {c['change']:+.3f} (95% {c['low']:+.3f} to {c['high']:+.3f}) over the start "
                     f"model's eval {c['start_eval_id'][:12]}")
        lines.append(f"  {_label(a):<10} {a['id'][:12]}  {a['name']:<24} {note}".rstrip())
    return lines


def _size(n: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n, i = n / 1024, i + 1
    return f"{n:.0f} {units[i]}" if i == 0 else f"{n:.1f} {units[i]}"


def _parents(store: ArtifactStore, m: Manifest) -> list[dict]:
    """The parents' kind, stage, name and run; {"id", "missing": True} for one no longer in the store."""
    out = []
    for pid in m.parents:
        try:
            p = store.manifest(pid)
        except ArtifactNotFoundError:
            out.append({"id": pid, "missing": True})
            continue
        out.append({"id": p.id, "kind": p.kind, "stage": p.stage, "name": p.name, "run_id": p.run_id,
                    "created": p.created})
    return out


def render_show(m: Manifest, parents: list[dict]) -> list[str]:
    """One artifact as text: where it came from, its key config, code version, files and every metric."""
    code = m.code
    commit = code.get("git_commit")
    lines = [f"{m.kind} {m.id[:12]}  {m.name}", f"  id       {m.id}", f"  stage    {m.stage}",
             f"  run      {m.run_id}  created {m.created}"]
    for i, p in enumerate(parents):
        what = "(missing from the store)" if p.get("missing") else f"{p['stage']:<9} {p['name']}  (run {p['run_id']})"
        lines.append(f"  {'parents' if i == 0 else '':<8} {p['id'][:12]}  {what}")
    cfg = ", ".join(f"{k}={v}" for k, v in _key_config(m).items())
    if cfg:
        lines.append(f"  config   {cfg}")
    lines.append(f"  code     posttrain {code.get('package')}, commit {commit[:12] if commit else 'unknown'}"
                 + (" (dirty)" if code.get("git_dirty") else ""))
    n = len(m.files)
    lines.append(f"  files    {n} file{'' if n == 1 else 's'}, {_size(sum(f['size'] for f in m.files.values()))}")
    if _summary(m.stage, m.metrics):
        lines.append(f"  result   {_summary(m.stage, m.metrics)}")
    for role, model_id in _roles(m).items():
        lines.append(f"  {role:<8} {model_id}")
    lines.extend(f"  {'metrics' if i == 0 else '':<8} {k} = {_fmt(v)}" for i, (k, v) in enumerate(m.metrics.items()))
    return lines


SIGPIPE_STATUS = 141
"""Exit status after stdout's reader went away: 128 + SIGPIPE, what a shell reports for `seq 1 1e9 | head`."""


def stdout_closed() -> int:
    """Call on BrokenPipeError from writing stdout: points stdout's file descriptor at /dev/null, so the
    interpreter's final flush of what is still buffered cannot raise (and print) again, and returns
    SIGPIPE_STATUS for the caller to exit with. Prints nothing: the reader has stopped listening on purpose."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return SIGPIPE_STATUS


def add_debug_flag(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """`--debug`: show the traceback of an error instead of its one-line message. Added to the top parser
    (`top`, default False) and to each subcommand (no default, so it does not reset a top-level --debug)."""
    parser.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="show the traceback of an error instead of one line")


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text}")
    return n


def add_commands(sub) -> None:
    """The store's subcommands (artifacts, lineage, verify, index), added to an argparse subparsers object."""
    arts = sub.add_parser("artifacts", help="list stored artifacts").add_subparsers(dest="sub", required=True)
    ls = arts.add_parser("list", help="every stored artifact, oldest first: kind, id, name, run, created")
    ls.add_argument("--kind", help="only artifacts of this kind (dataset, tokenizer, model, eval, ...)")
    ls.add_argument("--run", help="only artifacts of this run id")
    ls.add_argument("--json", action="store_true", help="print JSON instead of text")
    rs = sub.add_parser("runs", help="every pipeline run: its stages, artifact ids, eval accuracy with the paired "
                        "greedy change over the start model's eval (95%% interval), status")
    rs.add_argument("--limit", type=_positive, help="only the N newest runs")
    rs.add_argument("--json", action="store_true", help="print JSON instead of text")
    show = sub.add_parser("show", help="one artifact: manifest, parents, config, files, metrics")
    show.add_argument("id", help="artifact id or unique prefix")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.add_argument("--html", metavar="FILE", help="also write the artifact's page (its Flyte Deck, with charts) "
                                                    "to FILE, readable offline")
    lin = sub.add_parser("lineage", help="ancestor tree of an artifact")
    lin.add_argument("id", help="artifact id or unique prefix")
    lin.add_argument("--json", action="store_true", help="print the tree as nested JSON")
    ver = sub.add_parser("verify", help="re-hash every file of an artifact")
    ver.add_argument("id", help="artifact id or unique prefix")
    idx = sub.add_parser("index", help="rebuild the SQLite index from the manifests").add_subparsers(
        dest="sub", required=True)
    rebuild = idx.add_parser("rebuild", help="re-read every manifest into a new index (the index is only a cache)")
    for p in (ls, rs, show, lin, ver, rebuild):
        add_debug_flag(p, top=False)


def run_command(args: argparse.Namespace) -> int:
    """Run one of the store's subcommands; errors are printed (no traceback unless `args.debug`) with exit
    status 1, and a closed stdout pipe ends quietly (`stdout_closed`)."""
    try:
        store = ArtifactStore(args.home)
        if args.cmd == "artifacts":
            rows = store.list(kind=args.kind, run_id=args.run)
            if args.json:
                print(json.dumps([asdict(m) for m in rows], indent=2))
            else:
                for m in rows:
                    print(f"{m.kind:<9} {m.id[:12]}  {m.name:<28} run {m.run_id}  {m.created}")
        elif args.cmd == "runs":
            rows = runs(store)[:args.limit]
            if args.json or rows:  # an empty store prints nothing, as `artifacts list` does
                print(json.dumps(rows, indent=2) if args.json else "\n\n".join("\n".join(render_run(r)) for r in rows))
        elif args.cmd == "show":
            m = store.manifest(args.id)
            parents = _parents(store, m)
            key = {"stage": m.stage, **_roles(m),
                   "metrics": {k: m.metrics[k] for k in KEY_METRICS.get(m.stage, ()) if k in m.metrics}}
            print(json.dumps({"manifest": asdict(m), "parents": parents, "key": key}, indent=2) if args.json
                  else "\n".join(render_show(m, parents)))
            if args.html:  # the same page as the stage's Flyte Deck, with its charts
                from posttrain.report import render_page

                Path(args.html).write_text(render_page(store, m.id))
        elif args.cmd == "lineage":
            tree = store.lineage(args.id)
            print(json.dumps(_tree_json(tree), indent=2) if args.json else "\n".join(render_lineage(tree)))
        elif args.cmd == "verify":
            m = store.verify(args.id)
            print(f"ok: {m.kind} {m.id[:12]} ({m.name}): {len(m.files)} files match their sha256")
        elif args.cmd == "index":
            print(f"index rebuilt from manifests: {store.rebuild_index()} artifacts")
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's final flush
    except BrokenPipeError:
        return stdout_closed()
    except ArtifactError as e:
        if getattr(args, "debug", False):
            raise
        print(f"posttrain: error: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="posttrain", description=__doc__.split("\n")[0])
    ap.add_argument("--home", help="store root (default: $POSTTRAIN_HOME or ~/.posttrain)")
    add_debug_flag(ap, top=True)
    add_commands(ap.add_subparsers(dest="cmd", required=True))
    return run_command(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
