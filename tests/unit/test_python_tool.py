"""The built-in `python` tool (posttrain.envs.python_tool): the model's code runs with no network (a network
namespace with only `lo`), under time, memory and file-size limits, in a scratch folder of its own that is gone
after the call; what it printed comes back, a failure comes back as the end of its traceback or why it was
stopped, a flood is cut with a marker. Through the tool process as `rl.tools` names it: described to the model
from its signature and docstring, and called. A machine that cannot isolate the code refuses the tool."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from posttrain.envs import python_tool
from posttrain.envs.process import ToolProcess
from posttrain.envs.python_tool import SandboxUnavailable, isolation, python

PYTHON = "posttrain.envs.python_tool:python"


@pytest.fixture(params=["bwrap", "unshare"])
def mode(request, monkeypatch):
    """Each isolation this machine has (make test installs bubblewrap where apt-get works; `unshare -n` is the
    fallback), forced in turn."""
    if shutil.which(request.param) is None:
        pytest.skip(f"{request.param} is not installed here: the other isolation is tested")
    monkeypatch.setattr(python_tool, "isolation", lambda: request.param)
    return request.param


def test_it_returns_what_the_code_prints_and_why_it_failed(mode):
    assert python("print(sum(range(10)))") == "45\n"
    out = python("print('before'); raise ValueError('boom')")
    assert out.startswith("before\nerror: exit code 1\nTraceback") and out.endswith("ValueError: boom")
    assert python("import os; os._exit(3)") == "error: exit code 3"
    assert python("x" * (python_tool.MAX_CODE_CHARS + 1)).startswith("error: the code is")


def test_the_code_has_no_network_and_a_scratch_folder_that_is_removed(mode, tmp_path, monkeypatch):
    assert python("import socket; print(sorted(n for _, n in socket.if_nameindex()))") == "['lo']\n"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = python("open('a.txt', 'w').write('hi'); import os; print(os.listdir('.'), open('a.txt').read())")
    assert out == "['a.txt'] hi\n"  # its own folder: nothing else in it, not even its output files
    assert list(tmp_path.iterdir()) == []  # gone after the call
    if mode == "bwrap":  # the rest of the file system is read-only to it
        assert python("open('/etc/posttrain-test', 'w')").endswith("Read-only file system: '/etc/posttrain-test'")


def test_time_memory_and_output_limits(mode, monkeypatch):
    monkeypatch.setattr(python_tool, "TIMEOUT_S", 1.0)
    assert python("import time; print(1, flush=True); time.sleep(30)") == \
        "1\nerror: the code ran longer than 1 s and was stopped"
    assert python("while True: pass") == "error: the code ran longer than 1 s and was stopped"
    assert python("x = bytearray(2 << 30)").endswith("MemoryError")  # RLIMIT_AS: 512 MB
    flood = python("print('x' * 10**8)")  # RLIMIT_FSIZE stops the write at 8 MB; the model reads 2,000 characters
    assert "more characters cut" in flood and flood.endswith("OSError: [Errno 27] File too large")
    assert len(flood) < python_tool.OUTPUT_CHARS + 500


def test_through_the_tool_process_as_rl_tools_names_it():
    assert isolation() == ("bwrap" if shutil.which("bwrap") else "unshare")  # the strongest one that works
    tools = ToolProcess(tools=[PYTHON])
    try:
        (spec,) = tools.specs
        assert spec.name == "python" and spec.parameters["required"] == ["code"]
        assert "print" in spec.schema["function"]["parameters"]["properties"]["code"]["description"]
        assert PYTHON in tools.identity and len(tools.identity[PYTHON]) == 64  # its source hash, for lineage
        tools.open("e0", {})
        assert tools.call("e0", "python", {"code": "print(6 * 7)"}) == "42\n"
        tools.close("e0")
    finally:
        tools.shutdown()


def test_a_machine_that_cannot_isolate_the_code_refuses_the_tool(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="prlimit"):
        isolation.__wrapped__()
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/prlimit" if name == "prlimit" else None)
    with pytest.raises(SandboxUnavailable, match="needs bubblewrap .* or `unshare -n`"):
        isolation.__wrapped__()
