"""The user reward function's own process: started, called and replaced from `posttrain.rewards`.

`RewardProcess(path, python_path, limits)` starts ONE fresh interpreter (not multiprocessing's spawn, which
re-imports the parent's __main__ - in a Ray worker that is Ray's worker script) whose `sys.path` starts with
the `reward.python_path` folders. The child imports `module:function`, reads its call convention from
`inspect.signature` (`Signature`: per sample, or TRL-style batch when the first two parameters are
`prompts, completions`) and the sha256 of its module's source, reports both, then answers calls. Messages
are JSON over a socket pair (no pickle). `RewardProcess.call` returns (score, failure) pairs: anything but a
finite int/float, an exception (BaseException: `sys.exit` too), a death (`os._exit`, `os.abort`, a segfault),
an overrun of the per-call wall timeout, of the per-call CPU time or of the memory limit is a failure with its
reason; after a timeout, a death or running out of memory the child is killed and a fresh one started.

Limits (`Limits`, from `reward.*`), set by the child on itself after importing the function:
- memory: RLIMIT_AS = the address space the import left + `memory_mb` (hard limit too, so user code cannot
  raise it). An allocation over it raises MemoryError in Python (a failure; the child is replaced so leaked
  memory does not fail later calls) or kills a C extension (a death).
- CPU: before each call RLIMIT_CPU's soft limit is set to the CPU seconds used so far + `cpu_s`; over it the
  kernel sends SIGXCPU, whose default action ends the child (a death reported as the CPU limit). The hard
  limit stays unlimited (an unprivileged process could not raise it again for the next call), so code that
  catches SIGXCPU escapes this limit - the wall timeout still holds.
- no core files (RLIMIT_CORE 0), and the child's stdout is the parent's stderr: a function that prints
  cannot corrupt the output of `posttrain eval --json` or the parent's own stdout.
What to call with which arguments is `posttrain.rewards.RewardScorer`'s business.

Leaves out: network and filesystem isolation - the child is a plain process of the same user, killed with
its parent on Linux.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import numbers
import resource
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from pathlib import Path

from posttrain.config import ConfigError

BATCH_PARAMS = ("prompts", "completions")
"""A function whose first two parameters have these names is called once per batch (TRL convention)."""
STARTUP_TIMEOUT_S = 120.0
"""Time the child gets to import the user's module (imports of big libraries can take a while)."""


class RewardFunctionError(ConfigError):
    """The reward function cannot be used at all (bad name, import error, unusable signature or arguments);
    raised before any scoring, naming the `reward.*` setting at fault. A ConfigError, so entry points that
    report bad settings report this one the same way."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Per-call limits of the child (`reward.memory_mb`, `reward.cpu_s`; 0 = none)."""

    memory_mb: int = 0
    cpu_s: float = 0.0


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


def check_name(path: str) -> None:
    mod, sep, name = path.partition(":")
    if not sep or not mod or not name:
        raise RewardFunctionError(f"reward.fn: {path!r} must look like 'module:function'")


def import_by_path(path: str, setting: str, error: type[Exception]):
    """The object `path` ("module:name") names, imported (never eval'ed); `error` names the setting otherwise."""
    import importlib

    mod, sep, name = path.partition(":")
    if not sep or not mod or not name:
        raise error(f"{setting}: {path!r} must look like 'module:name'")
    try:
        return getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise error(f"{setting}: cannot import {path!r}: {type(e).__name__}: {e}") from None


def _load(path: str):
    check_name(path)
    fn = import_by_path(path, "reward.fn", RewardFunctionError)
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


def describe(e: BaseException) -> str:
    """'ValueError: message (file.py:12)': the exception and the innermost frame that raised it."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    text = str(e)
    return f"{type(e).__name__}: {text if len(text) <= 300 else text[:297] + '...'}{where}"


def source_sha256(obj) -> str:
    """sha256 of the source of `obj`'s module (its file's bytes when there is no source, e.g. a compiled one):
    the identity of user code in a model's lineage."""
    module = inspect.getmodule(obj)
    try:
        data = inspect.getsource(module).encode()
    except (OSError, TypeError):
        file = getattr(module, "__file__", None)
        data = Path(file).read_bytes() if file else b""
    return hashlib.sha256(data).hexdigest()


def die_with_parent() -> None:
    """Linux: the kernel kills this child when its parent dies (a SIGKILLed Ray actor leaves no orphan)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _address_space() -> int:
    """This process's virtual memory size in bytes (VmSize of /proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def limit_memory(memory_mb: int) -> None:
    """Linux only (where /proc gives the address space; RLIMIT_AS is not enforced on macOS)."""
    if memory_mb > 0 and sys.platform.startswith("linux"):
        cap = _address_space() + memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def limit_cpu(cpu_s: float) -> None:
    """Allow `cpu_s` more CPU seconds from now (soft RLIMIT_CPU; whole seconds, rounded up)."""
    if cpu_s > 0:
        r = resource.getrusage(resource.RUSAGE_SELF)
        resource.setrlimit(resource.RLIMIT_CPU, (math.ceil(r.ru_utime + r.ru_stime + cpu_s), resource.RLIM_INFINITY))


def _serve_fd(fd: int, path: str, python_path: list[str], limits: dict) -> None:
    _serve(Connection(fd), path, python_path, Limits(**limits))


def _serve(conn, path: str, python_path: list[str], limits: Limits) -> None:
    """Child main loop: import the function, set the limits, report its signature and identity, then answer
    calls."""
    die_with_parent()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.stdout = sys.stderr  # fd 1 is the parent's stderr already (Popen); this keeps Python's buffering apart
    sys.path[:0] = python_path
    try:
        fn = _load(path)
        sig = _signature(path, fn)
        identity = {"import_path": path, "source_sha256": source_sha256(fn)}
    except BaseException as e:  # noqa: BLE001 - anything at import time is reported to the parent
        msg = str(e) if isinstance(e, RewardFunctionError) else f"reward.fn: importing {path!r} failed: {describe(e)}"
        conn.send_bytes(json.dumps({"status": "error", "error": msg}).encode())
        return
    limit_memory(limits.memory_mb)
    conn.send_bytes(json.dumps({"status": "ready", "signature": sig.__dict__, "identity": identity}).encode())
    while True:
        try:
            msg = json.loads(conn.recv_bytes())
        except EOFError:  # the parent closed its end (or died)
            return
        if msg["op"] == "stop":
            return
        limit_cpu(limits.cpu_s)
        try:
            value = fn(**msg["kwargs"])
        except MemoryError as e:  # the address-space limit: report, then let the parent replace this process
            conn.send_bytes(json.dumps({"status": "out_of_memory", "error": describe(e)}).encode())
            continue
        except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are failures too
            conn.send_bytes(json.dumps({"status": "raised", "error": describe(e)}).encode())
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

_CHILD = ("import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
          "from posttrain.rewards.sandbox import _serve_fd; "
          "_serve_fd(int(sys.argv[1]), sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5]))")
"""The child's program: the parent's sys.path (so posttrain and the parent's test/module folders import),
then `_serve` on the inherited socket. A fresh interpreter, not multiprocessing's spawn: spawn re-imports the
parent's __main__ in the child (in a Ray worker that is Ray's worker script, with all of Ray)."""


class Child:
    """One fresh interpreter serving JSON requests on an inherited socket, limited by itself (`_serve` here,
    `posttrain.envs.process._serve` for tools): started and greeted, asked with a wall-time limit, and how it
    ended read from its exit status. `program` is a `python -c` text that takes the socket's fd as argv[1] and
    the parent's sys.path (JSON) as argv[2]; `args` follow. The greeting is the child's first message: a
    {"status": "ready", ...} dict, or {"status": "error", "error": ...} which raises `error(...)` here."""

    def __init__(self, program: str, args: list[str], *, what: str, hint: str, error: type[Exception],
                 cpu_limit: str, stdout=None, stderr=None):
        self.cpu_limit = cpu_limit
        self.conn, child = Pipe(duplex=True)
        fd = child.fileno()
        self.proc = subprocess.Popen([sys.executable, "-c", program, str(fd), json.dumps(sys.path), *args],
                                     pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
        child.close()
        if not self.conn.poll(STARTUP_TIMEOUT_S):
            self.kill()
            raise error(f"{what} took more than {STARTUP_TIMEOUT_S:.0f}s")
        try:
            self.hello = json.loads(self.conn.recv_bytes())
        except EOFError:
            code = self.proc.wait(5)
            raise error(f"the process {what} died (exit code {code}){hint}") from None
        if self.hello["status"] != "ready":
            self.proc.wait(5)
            raise error(self.hello["error"] + hint)

    def ask(self, msg: dict, timeout_s: float | None) -> dict:
        """The child's reply to `msg`, or {"status": "timeout"} after `timeout_s` (None: no limit), or
        {"status": "died", "error": why} when it ended first. Never raises for the child's sake."""
        try:
            self.conn.send_bytes(json.dumps(msg).encode())
            answered = self.conn.poll(timeout_s)
        except (BrokenPipeError, ConnectionResetError):  # died before or while reading the request
            answered = True
        if not answered:
            return {"status": "timeout"}
        try:
            return json.loads(self.conn.recv_bytes())
        except (EOFError, ConnectionResetError):
            return {"status": "died", "error": self.death(self.proc.wait(5))}

    def death(self, code: int) -> str:
        """Why the child ended, from its exit status: a signal by name, SIGXCPU as the CPU-time limit."""
        if code >= 0:
            return f"died (exit code {code})"
        if -code == signal.SIGXCPU:
            return f"exceeded its CPU-time limit ({self.cpu_limit}; killed by SIGXCPU)"
        try:
            return f"died (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"died (killed by signal {-code})"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)
        self.conn.close()

    def stop(self) -> None:
        """Ask the child to end, then make sure it has."""
        try:
            self.conn.send_bytes(json.dumps({"op": "stop"}).encode())
            self.proc.wait(2)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired, AttributeError, TypeError):
            pass  # AttributeError / TypeError: called from __del__ at interpreter exit, modules already torn down
        self.kill()


class RewardProcess:
    """The child process and its socket; restarts the child after a timeout, a death or running out of memory."""

    def __init__(self, path: str, python_path: list[str], limits: Limits = Limits()):
        self.path, self.python_path, self.limits = path, python_path, limits
        self.child: Child | None = None
        self._start()

    def _start(self) -> None:
        self.child = Child(_CHILD, [self.path, json.dumps(self.python_path), json.dumps(self.limits.__dict__)],
                           what=f"importing {self.path!r}", hint=path_hint(self.python_path),
                           error=_reward_fn_error, cpu_limit=f"reward.cpu_s = {self.limits.cpu_s:g}",
                           stdout=_stderr_fd())
        hello = self.child.hello
        self.signature = Signature(**{k: tuple(v) if isinstance(v, list) else v for k, v in hello["signature"].items()})
        self.identity: dict = hello["identity"]

    @property
    def proc(self) -> subprocess.Popen:
        return self.child.proc

    def call(self, op: str, kwargs: dict, n: int, timeout_s: float) -> list[tuple[float, str | None]]:
        """n results of one call: op "call" (one sample) or "batch" (n samples)."""
        reply = self.child.ask({"op": op, "kwargs": kwargs, "n": n}, timeout_s)
        if reply["status"] == "timeout":
            self._restart()
            return [(0.0, f"timed out after {timeout_s:g}s (reward process killed and replaced)")] * n
        if reply["status"] == "died":
            self._restart()
            return [(0.0, f"reward process {reply['error']}; replaced")] * n
        if reply["status"] == "out_of_memory":
            self._restart()
            return [(0.0, (f"{reply['error']}: over reward.memory_mb = {self.limits.memory_mb} "
                           "(reward process replaced)"))] * n
        if reply["status"] == "raised":
            return [(0.0, reply["error"])] * n
        return [(float(s), f) for s, f in reply["results"]]

    def _restart(self) -> None:
        self.child.kill()
        self._start()

    def close(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None


def _reward_fn_error(message: str) -> RewardFunctionError:
    """The reward process's start-up errors name the setting: "reward.fn: importing 'pkg:fn' took ...",
    "reward.fn: the process importing ... died"; an error the child reported names it already."""
    return RewardFunctionError(message if message.startswith("reward.fn:") else f"reward.fn: {message}")


def _stderr_fd() -> int | None:
    """The parent's stderr as the child's stdout; None (inherit stdout) when stderr has no file descriptor."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def path_hint(python_path: list[str]) -> str:
    return f" (reward.python_path = {python_path})" if python_path else " (reward.python_path is empty)"
