"""The episodes' tool process: the user's environment and tools run in ONE fresh interpreter per worker, never
in the worker itself, with per-call time, CPU and memory limits, like the reward function
(`posttrain.rewards.sandbox`: the same `Child` process plumbing and child-side limits).

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

import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection

from posttrain.envs.host import EnvironmentHost, StepResult, ToolFailure
from posttrain.envs.openenv import as_environment
from posttrain.envs.tools import ToolError, ToolSpec
from posttrain.rewards.sandbox import Child


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


def _cut(text: str, limit: int) -> str:
    if limit and len(text) > limit:
        return text[:limit] + f"\n[... {len(text) - limit} more characters cut ...]"
    return text


# --------------------------------------------------------------------------------------------- the child

def _serve_fd(fd: int, environment: str, tools: list[str], python_path: list[str], limits: dict) -> None:
    _serve(Connection(fd), environment, tools, python_path, ToolLimits(**limits))


def _serve(conn, environment: str, tools: list[str], python_path: list[str], limits: ToolLimits) -> None:
    import resource

    from posttrain.rewards.sandbox import (
        describe,
        die_with_parent,
        import_by_path,
        limit_cpu,
        limit_memory,
        source_sha256,
    )

    die_with_parent()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.path[:0] = python_path
    try:
        env_cls = import_by_path(environment, "rl.environment", ToolError) if environment else None
        fns = [import_by_path(t, "rl.tools", ToolError) for t in tools]
        host = EnvironmentHost(as_environment(env_cls) if env_cls is not None else None, fns)
        identity = {p: source_sha256(o) for p, o in zip([environment, *tools], [env_cls, *fns]) if p}
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
        self._child: Child | None = None
        self._start()

    # ---- the process

    def _start(self) -> None:
        hint = f" (python_path = {self.python_path})" if self.python_path else ""
        self._child = Child(_CHILD, [self.environment, json.dumps(self.tool_paths), json.dumps(self.python_path),
                                     json.dumps(asdict(self.limits))],
                            what=f"importing {self.environment or ', '.join(self.tool_paths)}", hint=hint,
                            error=ToolError, cpu_limit=f"{self.limits.cpu_s:g} CPU-s per call",
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        hello = self._child.hello
        self.specs = [ToolSpec(name=s["function"]["name"], schema=s) for s in hello["specs"]]
        self.identity: dict[str, str] = hello["identity"]
        self.has_step, self.has_reward = hello["has_step"], hello["has_reward"]

    def _replace(self) -> None:
        """A fresh process with every open episode rebuilt by replaying its history."""
        self._child.kill()
        self.restarts += 1
        self._start()
        for key, ep in self._episodes.items():
            for msg in [{"op": "open", "key": key, "row": ep.row}, *ep.history]:
                reply = self._child.ask(msg, self.limits.timeout_s or None)
                if reply.get("status") != "ok":
                    raise EpisodeError(f"episode {key}: replaying it into a replacement tool process failed "
                                            f"at {msg['op']}: {reply.get('error', reply.get('status'))}")

    def _request(self, msg: dict) -> dict:
        """One request; a timeout, death or out-of-memory replaces the process (and says so in the reply)."""
        reply = self._child.ask(msg, self.limits.timeout_s or None)
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
            failure = ToolFailure("died", f"the tool process {reply['error']}")
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
        if self._child is not None:
            self._child.stop()
            self._child = None
