"""Scoring completions: the built-in verifiers, or a user reward function run in a killable child process.

    scorer = RewardScorer(reward_cfg)                      # RL's reward workers and eval both use this
    scorer.check_arguments(["meta", "difficulty"])         # before any work: can every call be made?
    results = scorer.score([RewardSample.from_example(example, completion), ...])   # -> list[RewardResult]

With `reward.fn == ""` the task's built-in verifier (`posttrain.data.verifiers.score`) scores in-process
(trusted code). Otherwise `reward.fn` names a user function as `module:function` (imported, never eval'ed)
in ONE spawned child process whose `sys.path` starts with the `reward.python_path` folders; the parent never
imports user code. The call convention is read from the function's signature (`inspect.signature`):

- per sample (default): the function is called with the arguments it names, taken from
  `prompt` (text of the last user turn), `messages` (the prompt turns, [{role, content}]), `completion`
  (decoded text), `answer` (reference or None), `task`, and every key of the example's "columns" by its own
  name (the five reserved names win over a column of the same name). `**kwargs` receives all of them.
  A required parameter that no row can supply is refused by `check_arguments` before any work; one that a
  single row lacks is a recorded failure for that row.
- batch (TRL style): a function whose first two parameters are `prompts, completions` is called once per
  `score` call with lists (`prompts` = last user turn texts, `completions` = decoded texts) and every other
  argument it names (or, with `**kwargs`, every available one) as a list per name (None where a row lacks
  the column). It must return a list of the same length.

A score is a finite real number (int or float; a bool is NOT a score). Anything else - None, a string,
NaN, inf, a wrong-length batch -, an exception (BaseException, so `sys.exit` too), a dead child and a call
that overruns `reward.timeout_s` (per call; per batch for a batch function) become a `RewardResult` with
score 0.0 and the failure's reason; on a timeout or death the child is killed and a fresh one started, so
user code can neither crash nor hang a run (after MAX_TIMEOUTS_PER_SCORE timeouts in one `score` call the
rest of that batch fails without being called). Messages between the processes are JSON (no pickle), so the
row's columns must be JSON values, as the dataset contract requires.

Leaves out: limits other than time (memory, CPU, network) and filesystem isolation - the child is a plain
process of the same user, killed with its parent on Linux.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import numbers
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Self

from posttrain.config import ConfigError, RewardConfig

RESERVED = ("prompt", "messages", "completion", "answer", "task")
"""Argument names the scorer supplies itself; they win over a column of the same name."""
BATCH_PARAMS = ("prompts", "completions")
"""A function whose first two parameters have these names is called once per batch (TRL convention)."""
BUILTIN = "posttrain.data.verifiers:score"
STARTUP_TIMEOUT_S = 120.0
"""Time the child gets to import the user's module (imports of big libraries can take a while)."""
MAX_TIMEOUTS_PER_SCORE = 3
"""After this many timed-out calls within one `score` call, its remaining samples are recorded as failures
without calling the function: a function that always hangs costs 3 x timeout_s per batch, not one timeout
per sample (which would outlast the RL stage's own remote-call timeout)."""


class RewardFunctionError(ConfigError):
    """The reward function cannot be used at all (bad name, import error, unusable signature or arguments);
    raised before any scoring, naming the `reward.*` setting at fault. A ConfigError, so entry points that
    report bad settings report this one the same way."""


@dataclass(frozen=True, kw_only=True)
class RewardSample:
    """One completion to score, with the example it answers."""

    completion: str
    """Decoded completion text (special tokens skipped)."""
    messages: list[dict]
    """The prompt turns [{role, content}] the completion answers (without a final assistant turn)."""
    answer: str | None = None
    task: str | None = None
    columns: dict = field(default_factory=dict)
    """Every other column of the user's source row (JSON values); {} for built-in tasks."""

    @classmethod
    def from_example(cls, example: dict, completion: str) -> RewardSample:
        """From a dataset example row ({"messages", "answer", "task", "columns"}; "columns" may be missing)."""
        from posttrain.data.examples import prompt_messages

        return cls(completion=completion, messages=prompt_messages(example), answer=example.get("answer"),
                   task=example.get("task"), columns=example.get("columns") or {})

    def arguments(self) -> dict:
        """Every argument a per-sample function may name."""
        users = [m["content"] for m in self.messages if m.get("role") == "user"]
        return {**self.columns, "prompt": users[-1] if users else "", "messages": self.messages,
                "completion": self.completion, "answer": self.answer, "task": self.task}


@dataclass(frozen=True)
class RewardResult:
    score: float
    """The function's score; 0.0 when the call failed."""
    failure: str | None
    """None, or why the call failed ("ValueError: ... (file.py:12)", "timed out after 5s ...", ...)."""


@dataclass(frozen=True, kw_only=True)
class Signature:
    """What the child read from `inspect.signature` of the user function."""

    batch: bool
    required: tuple[str, ...]
    """Parameters without a default (besides `prompts, completions` for a batch function)."""
    optional: tuple[str, ...]
    var_kw: bool
    """The function takes **kwargs: it gets every available argument."""


# --------------------------------------------------------------------------------------------- the child


def _check_name(path: str) -> None:
    mod, sep, name = path.partition(":")
    if not sep or not mod or not name:
        raise RewardFunctionError(f"reward.fn: {path!r} must look like 'module:function'")


def _load(path: str):
    import importlib

    _check_name(path)
    mod, _, name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise RewardFunctionError(f"reward.fn: cannot import {path!r}: {type(e).__name__}: {e}") from None
    if not callable(fn):
        raise RewardFunctionError(f"reward.fn: {path!r} is a {type(fn).__name__}, not a function")
    return fn


def _signature(path: str, fn) -> Signature:
    P = inspect.Parameter
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as e:
        raise RewardFunctionError(f"reward.fn: cannot read the signature of {path!r}: {e}") from None
    positional_only = [p.name for p in params if p.kind is P.POSITIONAL_ONLY]
    if positional_only:
        raise RewardFunctionError(f"reward.fn: {path!r} has positional-only parameters {positional_only}: "
                                  "arguments are passed by name")
    named = [p for p in params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)]
    batch = [p.name for p in named[:2]] == list(BATCH_PARAMS)
    rest = named[2:] if batch else named
    return Signature(batch=batch, required=tuple(p.name for p in rest if p.default is P.empty),
                     optional=tuple(p.name for p in rest if p.default is not P.empty),
                     var_kw=any(p.kind is P.VAR_KEYWORD for p in params))


def _as_score(value) -> tuple[float, str | None]:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return 0.0, f"returned {shown} ({type(value).__name__}), not a number"
    x = float(value)
    if not math.isfinite(x):
        return 0.0, f"returned {x}, not a finite number"
    return x, None


def _describe(e: BaseException) -> str:
    """'ValueError: message (file.py:12)': the exception and the innermost frame that raised it."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    text = str(e)
    return f"{type(e).__name__}: {text if len(text) <= 300 else text[:297] + '...'}{where}"


def _module_source(fn) -> bytes:
    """The source of the function's module (its file's bytes when there is no source, e.g. a compiled one)."""
    module = inspect.getmodule(fn)
    try:
        return inspect.getsource(module).encode()
    except (OSError, TypeError):
        file = getattr(module, "__file__", None)
        return Path(file).read_bytes() if file else b""


def _die_with_parent() -> None:
    """Linux: the kernel kills this child when its parent dies (a SIGKILLed Ray actor leaves no orphan)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _serve_fd(fd: int, path: str, python_path: list[str]) -> None:
    _serve(Connection(fd), path, python_path)


def _serve(conn, path: str, python_path: list[str]) -> None:
    """Child main loop: import the function, report its signature and identity, then answer calls."""
    _die_with_parent()
    sys.path[:0] = python_path
    try:
        fn = _load(path)
        sig = _signature(path, fn)
        identity = {"import_path": path, "source_sha256": hashlib.sha256(_module_source(fn)).hexdigest()}
    except BaseException as e:  # noqa: BLE001 - anything at import time is reported to the parent
        msg = str(e) if isinstance(e, RewardFunctionError) else f"reward.fn: importing {path!r} failed: {_describe(e)}"
        conn.send_bytes(json.dumps({"status": "error", "error": msg}).encode())
        return
    conn.send_bytes(json.dumps({"status": "ready", "signature": sig.__dict__, "identity": identity}).encode())
    while True:
        try:
            msg = json.loads(conn.recv_bytes())
        except EOFError:  # the parent closed its end (or died)
            return
        if msg["op"] == "stop":
            return
        try:
            value = fn(**msg["kwargs"])
        except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are failures too
            conn.send_bytes(json.dumps({"status": "raised", "error": _describe(e)}).encode())
            continue
        if msg["op"] == "call":
            reply = {"status": "scored", "results": [_as_score(value)]}
        elif not isinstance(value, (list, tuple)):
            reply = {"status": "raised", "error": f"returned {type(value).__name__}, not a list of scores"}
        elif len(value) != msg["n"]:
            reply = {"status": "raised", "error": f"returned {len(value)} scores for {msg['n']} samples"}
        else:
            reply = {"status": "scored", "results": [_as_score(v) for v in value]}
        conn.send_bytes(json.dumps(reply).encode())


# --------------------------------------------------------------------------------------------- the parent

_CHILD = ("import json, sys; sys.path[:] = json.loads(sys.argv[2]); from posttrain.rewards import _serve_fd; "
          "_serve_fd(int(sys.argv[1]), sys.argv[3], json.loads(sys.argv[4]))")
"""The child's program: the parent's sys.path (so posttrain and the parent's test/module folders import),
then `_serve` on the inherited socket. A fresh interpreter, not multiprocessing's spawn: spawn re-imports the
parent's __main__ in the child (in a Ray worker that is Ray's worker script, with all of Ray)."""


class _Sandbox:
    """The child process and its socket; restarts the child after a timeout or a death."""

    def __init__(self, path: str, python_path: list[str]):
        self.path, self.python_path = path, python_path
        self._proc: subprocess.Popen | None = None
        self.signature, self.identity = self._start()

    def _start(self) -> tuple[Signature, dict]:
        self._conn, child = Pipe(duplex=True)
        fd = child.fileno()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(fd), json.dumps(sys.path), self.path, json.dumps(self.python_path)],
            pass_fds=(fd,), stdin=subprocess.DEVNULL)
        child.close()
        if not self._conn.poll(STARTUP_TIMEOUT_S):
            self._kill()
            raise RewardFunctionError(f"reward.fn: importing {self.path!r} took more than {STARTUP_TIMEOUT_S:.0f}s")
        try:
            hello = json.loads(self._conn.recv_bytes())
        except EOFError:
            code = self._proc.wait(5)
            raise RewardFunctionError(f"reward.fn: the process importing {self.path!r} died (exit code {code})"
                                      + _path_hint(self.python_path)) from None
        if hello["status"] != "ready":
            self._proc.wait(5)
            raise RewardFunctionError(hello["error"] + _path_hint(self.python_path))
        return Signature(**{k: tuple(v) if isinstance(v, list) else v for k, v in hello["signature"].items()}), \
            hello["identity"]

    def call(self, op: str, kwargs: dict, n: int, timeout_s: float) -> list[tuple[float, str | None]]:
        """n results of one call: op "call" (one sample) or "batch" (n samples)."""
        try:
            self._conn.send_bytes(json.dumps({"op": op, "kwargs": kwargs, "n": n}).encode())
            answered = self._conn.poll(timeout_s)
        except (BrokenPipeError, ConnectionResetError):  # died before or while reading the call
            answered = True
        if not answered:
            self._restart()
            return [(0.0, f"timed out after {timeout_s:g}s (reward process killed and replaced)")] * n
        try:
            reply = json.loads(self._conn.recv_bytes())
        except (EOFError, ConnectionResetError):
            code = self._proc.wait(5)
            self._restart()
            return [(0.0, f"reward process died (exit code {code}); replaced")] * n
        if reply["status"] == "raised":
            return [(0.0, reply["error"])] * n
        return [(float(s), f) for s, f in reply["results"]]

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._proc is not None:
            self._proc.wait(5)
        self._conn.close()

    def _restart(self) -> None:
        self._kill()
        self.signature, self.identity = self._start()

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            self._conn.send_bytes(json.dumps({"op": "stop"}).encode())
            self._proc.wait(2)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            pass
        self._kill()
        self._proc = None


def _path_hint(python_path: list[str]) -> str:
    return f" (reward.python_path = {python_path})" if python_path else " (reward.python_path is empty)"


class RewardScorer:
    """The one scoring entry point of RL's reward workers and of eval. Use as a context manager, or call
    close(), to end the child process."""

    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg
        self.name = cfg.fn or BUILTIN
        """What scores: the user's `module:function`, or the built-in verifiers."""
        self._box: _Sandbox | None = None
        if not cfg.fn:
            return
        missing = [p for p in cfg.python_path if not Path(p).is_dir()]
        if missing:
            raise RewardFunctionError(f"reward.python_path: {missing} not found (or not a folder) on this machine"
                                      f" ({os.uname().nodename}); every entry must exist where RL and eval run")
        _check_name(cfg.fn)
        self._box = _Sandbox(cfg.fn, [str(Path(p).resolve()) for p in cfg.python_path])

    @property
    def identity(self) -> dict:
        """{"import_path", "source_sha256"} of the function's module (or of posttrain/data/verifiers.py)."""
        if self._box is not None:
            return dict(self._box.identity)
        from posttrain.data import verifiers

        src = Path(verifiers.__file__).read_bytes()
        return {"import_path": BUILTIN, "source_sha256": hashlib.sha256(src).hexdigest()}

    @property
    def batch(self) -> bool:
        return self._box is not None and self._box.signature.batch

    def check_arguments(self, columns) -> None:
        """Refuse a function with a required parameter that neither the scorer nor any column supplies."""
        if self._box is None:
            return
        available = sorted(set(RESERVED) | set(columns))
        missing = [p for p in self._box.signature.required if p not in available]
        if missing:
            kind = "batch function" if self.batch else "function"
            raise RewardFunctionError(
                f"reward.fn: {self.name} ({kind}) requires parameter(s) {missing}, which no row supplies; "
                f"available argument names: {available} (the reserved ones plus the dataset's columns)")

    def score(self, samples: list[RewardSample]) -> list[RewardResult]:
        if not samples:
            return []
        if self._box is None:
            from posttrain.data import verifiers

            return [RewardResult(verifiers.score(s.task, s.completion, s.answer), None) for s in samples]
        if self.batch:
            return self._score_batch(samples)
        out: list[RewardResult] = []
        timeouts = 0
        for s in samples:
            if timeouts >= MAX_TIMEOUTS_PER_SCORE:
                out.append(RewardResult(0.0, f"not called: {timeouts} calls in this batch timed out already"))
                continue
            r = self._score_one(s)
            timeouts += r.failure is not None and r.failure.startswith("timed out")
            out.append(r)
        return out

    def _score_one(self, s: RewardSample) -> RewardResult:
        sig, args = self._box.signature, s.arguments()
        absent = [p for p in sig.required if p not in args]
        if absent:
            return RewardResult(0.0, f"row has no column {absent[0]!r} (a required parameter of {self.name})")
        names = args.keys() if sig.var_kw else [*sig.required, *sig.optional]
        kwargs = {k: args[k] for k in names if k in args}
        (score, failure), = self._box.call("call", kwargs, 1, self.cfg.timeout_s)
        return RewardResult(score, failure)

    def _score_batch(self, samples: list[RewardSample]) -> list[RewardResult]:
        sig, rows = self._box.signature, [s.arguments() for s in samples]
        if sig.var_kw:
            names = sorted({k for r in rows for k in r} - {"prompt", "completion"})
        else:
            names = [k for k in (*sig.required, *sig.optional) if k in sig.required or any(k in r for r in rows)]
        kwargs = {"prompts": [r["prompt"] for r in rows], "completions": [r["completion"] for r in rows],
                  **{k: [r.get(k) for r in rows] for k in names}}
        return [RewardResult(s, f) for s, f in self._box.call("batch", kwargs, len(rows), self.cfg.timeout_s)]

    def close(self) -> None:
        if self._box is not None:
            self._box.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def reward_identity(cfg: RewardConfig) -> dict:
    """{"import_path", "source_sha256"} of the configured scorer (the user function is imported in a
    short-lived child, never in this process)."""
    with RewardScorer(cfg) as scorer:
        return scorer.identity
