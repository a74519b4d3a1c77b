"""The store's commands: list artifacts, show lineage, verify files, rebuild the index.

The `posttrain` console command (posttrain/cli.py) adds these to its own (`eval`); this module runs alone
too (`python -m posttrain.artifacts.cli`) and imports nothing above the artifact store.

    posttrain [--home ROOT] artifacts list [--kind K] [--run R] [--json]
    posttrain [--home ROOT] lineage ID [--json]
    posttrain [--home ROOT] verify ID
    posttrain [--home ROOT] index rebuild

Errors print one line, `posttrain: error: ...`, with exit status 1; `--debug` (before or after the command)
shows the traceback instead. Output into a pipe whose reader stops early (`posttrain artifacts list | head`)
ends quietly with status 141, as a command killed by SIGPIPE does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from posttrain.artifacts.errors import ArtifactError
from posttrain.artifacts.store import ArtifactStore, LineageNode


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
         "samples_per_prompt", "kl_coef", "num_problems", "k", "temperature", "nproc", "algorithm"}


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


def add_commands(sub) -> None:
    """The store's subcommands (artifacts, lineage, verify, index), added to an argparse subparsers object."""
    arts = sub.add_parser("artifacts", help="list stored artifacts").add_subparsers(dest="sub", required=True)
    ls = arts.add_parser("list")
    ls.add_argument("--kind")
    ls.add_argument("--run")
    ls.add_argument("--json", action="store_true")
    lin = sub.add_parser("lineage", help="ancestor tree of an artifact")
    lin.add_argument("id")
    lin.add_argument("--json", action="store_true")
    ver = sub.add_parser("verify", help="re-hash every file of an artifact")
    ver.add_argument("id")
    idx = sub.add_parser("index", help="rebuild the SQLite index from the manifests").add_subparsers(
        dest="sub", required=True)
    rebuild = idx.add_parser("rebuild")
    for p in (ls, lin, ver, rebuild):
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
