"""The built-in `python` tool: the model's code runs in its own process with no network, a time, memory and file
size limit and a scratch folder of its own, removed after the call (`rl.tools` / `eval.tools`
["posttrain.envs.python_tool:python"]).

    python("print(sum(range(10)))")   # -> "45"

Isolation, the strongest this machine allows, chosen once per process (`isolation()`):
- `bwrap` (bubblewrap) where it is installed and works: every namespace unshared (the network too: only a
  loopback device), a read-only view of `/`, a private `/tmp`, and the scratch folder the only writable one;
- else `unshare -n` (a network namespace of its own: no interface but `lo`), the scratch folder as its working
  directory;
- else none: the tool refuses to run code at all (`SandboxUnavailable`, naming what it tried) - it never runs the
  model's code with the network silently.
In both cases the process runs `python -I` (no user site, no PYTHON* variables) in a new session under
`prlimit` (RLIMIT_AS MEMORY_MB, RLIMIT_CPU, RLIMIT_FSIZE FILE_MB), its stdout and stderr written to files beside
the scratch folder, out of the code's reach (a flood stops at the file size limit and is cut to OUTPUT_CHARS
with a marker), and is killed with its whole session at TIMEOUT_S. What the model reads back: what the code printed; on failure, the end of
its traceback, or why it was stopped.

This is one tool call's sandbox; the tool process that calls it (posttrain.envs.process) adds its own per-call
time and memory limits around every tool, this one included.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

TIMEOUT_S = 5.0
"""Wall seconds one call's code may run."""
MEMORY_MB = 512
"""Address space of the code's process (RLIMIT_AS)."""
FILE_MB = 8
"""Largest file the code may write, its printed output included (RLIMIT_FSIZE)."""
OUTPUT_CHARS = 2000
"""What the model reads back at most, of stdout and of the traceback each; the rest is cut with a marker."""
MAX_CODE_CHARS = 20000


class SandboxUnavailable(RuntimeError):
    """Neither bwrap nor `unshare -n` works here: the python tool will not run code with the network."""


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _bwrap(scratch: str) -> list[str]:
    return ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/tmp", "--bind", scratch, scratch, "--chdir", scratch, "--"]


@cache
def isolation() -> str:
    """"bwrap" or "unshare": the strongest isolation that runs here (checked once per process); raises
    SandboxUnavailable when neither does."""
    if not shutil.which("prlimit"):
        raise SandboxUnavailable("the python tool needs `prlimit` (util-linux) to limit the code's memory, CPU "
                                 "and file sizes; it is not on this machine's PATH")
    if shutil.which("bwrap") and _works([*_bwrap(tempfile.gettempdir()), "true"]):
        return "bwrap"
    if shutil.which("unshare") and _works(["unshare", "-n", "--", "true"]):
        return "unshare"
    raise SandboxUnavailable("the python tool needs bubblewrap (`bwrap`, e.g. apt-get install bubblewrap) or "
                             "`unshare -n` (root or user namespaces) to run code without network; neither works "
                             "on this machine")


def _limited() -> list[str]:
    """`prlimit` (util-linux, as `unshare`) before the interpreter: RLIMIT_AS, RLIMIT_CPU and RLIMIT_FSIZE."""
    return ["prlimit", f"--as={MEMORY_MB * 2**20}", f"--cpu={int(TIMEOUT_S) + 1}", f"--fsize={FILE_MB * 2**20}", "--"]


def _read(path: Path) -> str:
    data = path.read_bytes() if path.exists() else b""
    text = data.decode("utf-8", errors="replace")
    if len(text) > OUTPUT_CHARS:
        return text[:OUTPUT_CHARS] + f"\n[... {len(text) - OUTPUT_CHARS} more characters cut ...]"
    return text


def run_code(code: str) -> str:
    """Run `code` in the sandbox; what it printed, or why it failed (see the module's docstring)."""
    if len(code) > MAX_CODE_CHARS:
        return f"error: the code is {len(code)} characters long; at most {MAX_CODE_CHARS}"
    how = isolation()
    call = Path(tempfile.mkdtemp(prefix="posttrain-python-"))
    try:
        scratch = call / "scratch"  # the code's working directory; its output files lie beside it, out of its reach
        scratch.mkdir()
        prefix = _bwrap(str(scratch)) if how == "bwrap" else ["unshare", "-n", "--"]
        out, err = call / "stdout", call / "stderr"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = subprocess.Popen([*prefix, *_limited(), sys.executable, "-I", "-c", code], cwd=scratch,
                                    stdin=subprocess.DEVNULL, stdout=fo, stderr=fe, start_new_session=True)
            try:
                code_rc = proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                stopped = f"error: the code ran longer than {TIMEOUT_S:g} s and was stopped"
                return "\n".join(x for x in (_read(out).rstrip(), stopped) if x)
        printed = _read(out)
        if code_rc == 0:
            return printed
        why = (f"killed by signal {signal.Signals(-code_rc).name}" if code_rc < 0 else f"exit code {code_rc}")
        if code_rc in (-signal.SIGXCPU, -signal.SIGKILL):
            why += f" (limits: {TIMEOUT_S:g} s, {MEMORY_MB} MB)"
        elif code_rc == -signal.SIGXFSZ:
            why += f" (it wrote more than {FILE_MB} MB)"
        tail = _read(err).strip().splitlines()[-6:]
        return "\n".join(x for x in (printed.rstrip(), f"error: {why}", *tail) if x)
    finally:
        shutil.rmtree(call, ignore_errors=True)


def python(code: str) -> str:
    """Run a Python program and return what it prints.

    Args:
        code: The program. Only what it prints is returned, so print the results you need.
    """
    return run_code(code)


isolation()  # at import - in the tool process as it starts, before any episode: a machine that cannot isolate the
# model's code refuses the tool there, naming what it tried (the environment role's start fails with it)
