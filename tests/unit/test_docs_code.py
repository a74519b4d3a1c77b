"""The Python blocks of the README and the docs run as written (their bash blocks: tests/integration/
test_readme_commands.py). Each ```python block is executed on its own; a block that defines an environment is
then hosted as the RL workers host one (posttrain.envs.host.EnvironmentHost) and played for an episode."""

from __future__ import annotations

import re
from pathlib import Path

from posttrain.envs.host import EnvironmentHost

ROOT = Path(__file__).resolve().parents[2]


def python_blocks() -> dict[str, str]:
    """{page:line: source} for every ```python block."""
    out = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
            out[f"{page.name}:{text[:m.start()].count(chr(10)) + 1}"] = m.group(1)
    return out


def test_every_python_block_runs():
    blocks = python_blocks()
    assert blocks, "no ```python block found: the parser or the docs changed"
    for where, source in blocks.items():
        exec(compile(source, where, "exec"), {"__name__": f"docs_block_{len(where)}"})  # noqa: S102 - our own docs


def test_the_environment_in_the_agents_page_plays_an_episode_as_documented():
    namespace: dict = {"__name__": "docs_agents"}
    (where, source), = [(w, s) for w, s in python_blocks().items() if w.startswith("agents.md:")]
    exec(compile(source, where, "exec"), namespace)  # noqa: S102 - our own docs
    host = EnvironmentHost(namespace["Retry"])
    assert host.has_step and host.has_reward and host.specs == []  # no public method besides the protocol's
    assert host.open("e0", {"answer": " 42 ", "prompt": "What is 40 + 2?"}) is None  # reset takes only `answer`
    first = host.step("e0", "41")
    assert first.observation == "wrong, try again" and not first.done
    second = host.step("e0", "42")
    assert second.done and host.reward("e0") == 0.5  # right on the second attempt
    host.close("e0")
