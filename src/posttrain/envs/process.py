"""The episodes' tool process: the user's environment and tools run in ONE fresh interpreter per worker, never
in the worker itself, with per-call time, CPU and memory limits, like the reward function
(`posttrain.rewards.sandbox`, whose child-side limits this reuses).

    tools = ToolProcess(environment="pkg.envs:Calculator", tools=["pkg.tools:search"],
                        python_path=[...], limits=ToolLimits(timeout_s=10, memory_mb=512))
    tools.specs                                   # the tools' schemas, read in the child
    first = tools.open("ep-0", row)               # a fresh instance per episode: reset(**row)
    text = tools.call("ep-0", "calculate", {"expression": "12 * 34"})   # str, or a ToolFailure
    tools.close("ep-0")

A call that raises, returns what is not text, overruns its wall time or CPU time, runs out of memory or kills
the process (`os._exit`, a segfault) is a `ToolFailure` the model reads as the tool's result; the episode and
the run go on. After a timeout, a death or out-of-memory the process is replaced and the episodes still open
are rebuilt in the new one by replaying what each did so far (its row, then its successful calls and steps in
order): an environment must be deterministic given its row and its calls, as a seeded one is. What a tool
prints is discarded (10 MB of prints cost nothing); a result longer than `ToolLimits.max_result_chars` is cut
there, with a visible marker. Messages are JSON over a socket pair (no pickle).

Leaves out: network and filesystem isolation of user tools - the child is a plain process of the same user,
killed with its parent on Linux. The built-in `python` tool that runs model-written code adds those.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, Pipe
from pathlib import Path

from posttrain.envs.host import EnvironmentHost, StepResult, ToolFailure
from posttrain.envs.tools import ToolError, ToolSpec

STARTUP_TIMEOUT_S = 120.0
"""Time the child gets to import the environment and tools."""


@dataclass(frozen=True, kw_only=True)
class ToolLimits:
    """Per-call limits of the tool process (0 = none)."""
    timeout_s: float = 10.0
    """Wall seconds per call (tool, step, reset); over it the process is replaced."""
    cpu_s: float = 0.0
    memory_mb: int = 0
    """Address space the calls may add to what the imports took."""
    max_result_chars: int = 65536
    """A longer result is cut here (with a marker) before it leaves the process."""


def _load(path: str, where: str):
    mod, sep, name = path.partition(":")
    if not sep or not mod or not name:
        raise ToolError(f"{where}: {path!r} must look like 'module:Name'")
    try:
        return getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise ToolError(f"{where}: cannot import {path!r}: {type(e).__name__}: {e}") from None


def _source_sha256(obj) -> str:
    module = inspect.getmodule(obj)
    try:
        data = inspect.getsource(module).encode()
    except (OSError, TypeError):
        file = getattr(module, "__file__", None)
        data = Path(file).read_bytes() if file else b""
    return hashlib.sha256(data).hexdigest()


def _cut(text: str, limit: int) -> str:
    if limit and len(text) > limit:
        return text[:limit] + f"\n[... {len(text) - limit} more characters cut ...]"
    return text


# --------------------------------------------------------------------------------------------- the child

def _serve_fd(fd: int, environment: str, tools: list[str], python_path: list[str], limits: dict) -> None:
    _serve(Connection(fd), environment, tools, python_path, ToolLimits(**limits))


def _serve(conn, environment: str, tools: list[str], python_path: list[str], limits: ToolLimits) -> None:
    import resource

    from posttrain.rewards.sandbox import describe, die_with_parent, limit_cpu, limit_memory

    die_with_parent()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.path[:0] = python_path
    try:
        env_cls = _load(environment, "rl.environment") if environment else None
        fns = [_load(t, "rl.tools") for t in tools]
        host = EnvironmentHost(env_cls, fns)
        identity = {p: _source_sha256(o) for p, o in zip([environment, *tools], [env_cls, *fns]) if p}
    except BaseException as e:  # noqa: BLE001 - anything at import time is reported to the parent
        conn.send_bytes(json.dumps({"status": "error", "error": str(e) if isinstance(e, ToolError)
                                    else f"importing the environment / tools failed: {describe(e)}"}).encode())
        return
    limit_memory(limits.memory_mb)
    conn.send_bytes(json.dumps({"status": "ready", "specs": [s.schema for s in host.specs], "identity": identity,
                                "has_step": host.has_step, "has_reward": host.has_reward}).encode())
    while True:
        try:
            msg = json.loads(conn.recv_bytes())
        except EOFError:
            return
        op = msg["op"]
        if op == "stop":
            return
        limit_cpu(limits.cpu_s)
        try:
            if op == "open":
                value = host.open(msg["key"], msg["row"])
            elif op == "call":
                out = host.call(msg["key"], msg["name"], msg["arguments"])
                value = asdict(out) if isinstance(out, ToolFailure) else _cut(out, limits.max_result_chars)
            elif op == "step":
                r = host.step(msg["key"], msg["text"])
                value = {**asdict(r), "observation": _cut(r.observation, limits.max_result_chars)}
            elif op == "reward":
                value = host.reward(msg["key"])
            else:  # close
                host.close(msg["key"])
                value = None
        except MemoryError as e:
            conn.send_bytes(json.dumps({"status": "out_of_memory", "error": describe(e)}).encode())
            continue
        except BaseException as e:  # noqa: BLE001 - the environment's own error (reset, step, get_reward)
            conn.send_bytes(json.dumps({"status": "raised", "error": describe(e)}).encode())
            continue
        conn.send_bytes(json.dumps({"status": "ok", "value": value}).encode())


# --------------------------------------------------------------------------------------------- the parent

_CHILD = ("import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
          "from posttrain.envs.process import _serve_fd; "
          "_serve_fd(int(sys.argv[1]), sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5]), "
          "json.loads(sys.argv[6]))")


class EpisodeError(RuntimeError):
    """The environment itself failed where there is no model to tell (reset on a row, step, get_reward):
    the message names the episode and the environment."""


@dataclass
class _Episode:
    row: dict
    history: list[dict] = field(default_factory=list)
    """The successful calls and steps so far, replayed into a replacement process."""


class ToolProcess:
    """The child process, its socket and the open episodes; replaces the child after a timeout, a death or
    running out of memory."""

    def __init__(self, environment: str = "", tools: list[str] = (), python_path: list[str] = (),
                 limits: ToolLimits = ToolLimits()):
        if not environment and not tools:
            raise ToolError("an episode needs rl.environment or rl.tools")
        self.environment, self.tool_paths = environment, list(tools)
        self.python_path, self.limits = list(python_path), limits
        self.failures: dict[str, int] = {}
        """Failed tool calls by kind (raised, not_text, timeout, died, out_of_memory, unknown_tool)."""
        self.restarts = 0
        self._episodes: dict[str, _Episode] = {}
        self._proc: subprocess.Popen | None = None
        self._start()

    # ---- the process

    def _start(self) -> None:
        self._conn, child = Pipe(duplex=True)
        fd = child.fileno()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(fd), json.dumps(sys.path), self.environment,
             json.dumps(self.tool_paths), json.dumps(self.python_path), json.dumps(asdict(self.limits))],
            pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        child.close()
        what = self.environment or ", ".join(self.tool_paths)
        if not self._conn.poll(STARTUP_TIMEOUT_S):
            self._kill()
            raise ToolError(f"importing {what} took more than {STARTUP_TIMEOUT_S:.0f}s")
        try:
            hello = json.loads(self._conn.recv_bytes())
        except EOFError:
            raise ToolError(f"the process importing {what} died (exit code {self._proc.wait(5)})") from None
        if hello["status"] != "ready":
            self._proc.wait(5)
            raise ToolError(hello["error"] + (f" (python_path = {self.python_path})" if self.python_path else ""))
        self.specs = [ToolSpec(name=s["function"]["name"], schema=s) for s in hello["specs"]]
        self.identity: dict[str, str] = hello["identity"]
        self.has_step, self.has_reward = hello["has_step"], hello["has_reward"]

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._proc is not None:
            self._proc.wait(5)
        self._conn.close()

    def _death(self, code: int) -> str:
        if code >= 0:
            return f"the tool process exited (code {code})"
        if -code == signal.SIGXCPU:
            return f"the tool exceeded its CPU-time limit ({self.limits.cpu_s:g} s)"
        try:
            return f"the tool process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the tool process was killed by signal {-code}"

    def _replace(self) -> None:
        """A fresh process with every open episode rebuilt by replaying its history."""
        self._kill()
        self.restarts += 1
        self._start()
        for key, ep in self._episodes.items():
            for msg in [{"op": "open", "key": key, "row": ep.row}, *ep.history]:
                reply = self._send(msg)
                if reply.get("status") != "ok":
                    raise EpisodeError(f"episode {key}: replaying it into a replacement tool process failed "
                                            f"at {msg['op']}: {reply.get('error', reply.get('status'))}")

    def _send(self, msg: dict) -> dict:
        """One request; {"status": "timeout" | "died" | ...} instead of raising when the child fails."""
        try:
            self._conn.send_bytes(json.dumps(msg).encode())
            answered = self._conn.poll(self.limits.timeout_s or None)
        except (BrokenPipeError, ConnectionResetError):
            answered = True
        if not answered:
            return {"status": "timeout"}
        try:
            return json.loads(self._conn.recv_bytes())
        except (EOFError, ConnectionResetError):
            return {"status": "died", "error": self._death(self._proc.wait(5))}

    def _request(self, msg: dict) -> dict:
        reply = self._send(msg)
        if reply["status"] in ("timeout", "died", "out_of_memory"):
            self._replace()
        return reply

    # ---- episodes

    def open(self, key: str, row: dict) -> str | None:
        """Start an episode; its first observation (reset's) or None."""
        self._episodes[key] = _Episode(row=row)
        reply = self._request({"op": "open", "key": key, "row": row})
        if reply["status"] != "ok":
            self._episodes.pop(key)
            raise EpisodeError(f"episode {key}: {self.environment}.reset failed: "
                                    f"{reply.get('error', reply['status'])}")
        return reply["value"]

    def call(self, key: str, name: str, arguments: dict) -> str | ToolFailure:
        """One tool call: its text, or the failure the model reads instead (counted in `failures`)."""
        msg = {"op": "call", "key": key, "name": name, "arguments": arguments}
        reply = self._request(msg)
        if reply["status"] == "ok" and isinstance(reply["value"], str):
            self._episodes[key].history.append(msg)
            return reply["value"]
        if reply["status"] == "ok":
            failure = ToolFailure(**reply["value"])
            self._episodes[key].history.append(msg)  # a tool that raised may have changed the state first
        elif reply["status"] == "timeout":
            failure = ToolFailure("timeout", f"the tool timed out after {self.limits.timeout_s:g} s")
        elif reply["status"] == "out_of_memory":
            failure = ToolFailure("out_of_memory", f"the tool ran out of memory ({self.limits.memory_mb} MB)")
        elif reply["status"] == "died":
            failure = ToolFailure("died", reply["error"])
        else:
            failure = ToolFailure("raised", reply["error"])
        self.failures[failure.kind] = self.failures.get(failure.kind, 0) + 1
        return failure

    def step(self, key: str, text: str) -> StepResult:
        """The environment's text step; an environment that fails here ends the run, naming the episode."""
        msg = {"op": "step", "key": key, "text": text}
        reply = self._request(msg)
        if reply["status"] != "ok":
            raise EpisodeError(f"episode {key}: {self.environment}.step failed: "
                                    f"{reply.get('error', reply['status'])}")
        self._episodes[key].history.append(msg)
        return StepResult(**reply["value"])

    def reward(self, key: str) -> float | None:
        reply = self._request({"op": "reward", "key": key})
        if reply["status"] != "ok":
            raise EpisodeError(f"episode {key}: {self.environment}.get_reward failed: "
                                    f"{reply.get('error', reply['status'])}")
        return reply["value"]

    def close(self, key: str) -> None:
        self._episodes.pop(key, None)
        self._request({"op": "close", "key": key})

    def shutdown(self) -> None:
        if self._proc is None:
            return
        try:
            self._conn.send_bytes(json.dumps({"op": "stop"}).encode())
            self._proc.wait(2)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            pass
        self._kill()
        self._proc = None
