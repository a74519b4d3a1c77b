"""Environments and tools (posttrain.envs): schemas read from typed, documented callables; the tool-call format
parsed from any text without raising; the built-in environments; and the tool process, where every way a
tool can fail - raise, hang, exit, flood, return non-UTF-8 bytes, exhaust memory - becomes a counted failure
the model reads, with the episode's state rebuilt in the replacement process."""

from __future__ import annotations

import random

import pytest

from posttrain.envs.builtin import Calculator, GuessNumber, evaluate
from posttrain.envs.calls import CallError, ToolCall, parse_call, render_call, response_turn, tools_block
from posttrain.envs.host import EnvironmentHost, ToolFailure, as_text
from posttrain.envs.process import EpisodeError, ToolLimits, ToolProcess
from posttrain.envs.tools import ToolError, environment_tools, tool_specs
from tests.unit.flaky_env import Counter, shout, undocumented


def test_a_tool_schema_comes_from_the_signature_and_the_docstring():
    (spec,) = environment_tools(Calculator)
    assert spec.name == "calculate"
    assert spec.parameters == {"type": "object", "required": ["expression"], "properties": {"expression": {
        "type": "string", "description": 'The expression, with integers, + - * // % and parentheses, e.g. "123 * 456".'}}}
    names = [s.name for s in environment_tools(Counter)]
    assert "reset" not in names and "get_reward" not in names and "add" in names  # the episode protocol is not a tool


def test_a_tool_the_model_cannot_be_told_about_is_refused_naming_it():
    with pytest.raises(ToolError, match=r"rl.tools: undocumented: has no docstring"):
        tool_specs([undocumented])

    def untyped(x):
        """Does.

        Args:
            x: A thing.
        """

    with pytest.raises(ToolError, match="missing a type hint"):
        tool_specs([untyped])

    def blank(x: int) -> str:
        """Does.

        Args:
            x:
        """

    with pytest.raises(ToolError, match=r"argument\(s\) \['x'\] have no description"):
        tool_specs([blank])
    with pytest.raises(ToolError, match="two tools are named 'shout'"):
        tool_specs([shout, shout])


def test_calls_are_parsed_from_the_text_and_checked_against_the_tools():
    specs = environment_tools(Calculator)
    call = render_call("calculate", {"expression": "12 * 34"})
    assert parse_call("Let me compute. " + call + " trailing", specs) == ToolCall("calculate", {"expression": "12 * 34"})
    assert parse_call("The answer is 408.", specs) is None
    for text, why in [("<tool_call>{oops}</tool_call>", "not valid JSON"), ("<tool_call>[1]</tool_call>", "JSON object"),
                      ('<tool_call>{"name": "sqrt", "arguments": {}}</tool_call>', "no tool named 'sqrt'"),
                      ('<tool_call>{"name": "calculate", "arguments": {}}</tool_call>', "missing argument"),
                      ('<tool_call>{"name": "calculate", "arguments": {"expression": "1", "x": 2}}</tool_call>',
                       "unknown argument"),
                      ('<tool_call>{"name": "calculate"', "not closed")]:
        out = parse_call(text, specs)
        assert isinstance(out, CallError) and why in out.message, (text, out)
    rng = random.Random(0)
    alphabet = '<>/{}[]":,tool_call nameargumentscalculate0123456789\\'
    for _ in range(3000):  # never raises on any text
        parse_call("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))), specs)
    block = tools_block(specs)
    assert block.count("\n") == 3 and '"name": "calculate"' in block
    assert response_turn("408") == {"role": "user", "content": "<tool_response>\n408\n</tool_response>"}


def test_the_calculator_evaluates_arithmetic_from_its_syntax_tree_only():
    assert evaluate("123 * 456") == 56088 and evaluate("-(7 + 3) // 3 % 5") == 1
    for bad in ["__import__('os')", "2 ** 10", "1.5 * 2", "x + 1", "9" * 61 + " * 1", "1 // 0", ""]:
        with pytest.raises(ValueError):
            evaluate(bad)


def test_guess_number_rewards_fewer_turns():
    env = GuessNumber()
    assert "between 1 and 32" in env.reset(low=1, high=32, secret=20, max_turns=6)
    assert [env.step(g)["observation"] for g in ("16", "I say 24", "20")] == ["higher", "lower", "correct"]
    assert env.get_reward() == pytest.approx(1 - 0.5 * 2 / 5)
    env.reset(low=1, high=32, secret=5, max_turns=2)
    assert env.step("no idea") == {"observation": "Answer with a number.", "done": False}
    assert env.step("7") == {"observation": "lower", "done": True} and env.get_reward() == 0.0


def test_tool_results_become_text_or_a_failure():
    assert as_text("a") == "a" and as_text(3) == "3" and as_text({"x": [1, None]}) == '{"x": [1, null]}'
    assert as_text(b"ok") == "ok"
    assert isinstance(as_text(b"\xff"), ToolFailure) and isinstance(as_text(object()), ToolFailure)
    assert isinstance(as_text(float("nan")), ToolFailure)
    host = EnvironmentHost(Counter, [shout])
    assert host.open("e", {"start": 2}) == "counting from 2"
    assert host.call("e", "add", {"n": 3}) == "5" and host.call("e", "shout", {"text": "hi"}) == "HI"
    assert host.call("e", "raises", {}).kind == "raised" and host.call("e", "reset", {}).kind == "unknown_tool"
    assert host.reward("e") == 5.0


@pytest.mark.timeout(300)
def test_every_failing_tool_is_a_counted_failure_and_the_episode_survives_replacement():
    tools = ToolProcess(environment="tests.unit.flaky_env:Counter", tools=["tests.unit.flaky_env:shout"],
                        limits=ToolLimits(timeout_s=5, memory_mb=256, max_result_chars=1000))
    try:
        assert {s.name for s in tools.specs} >= {"add", "hang", "shout"} and tools.has_reward
        assert set(tools.identity) == {"tests.unit.flaky_env:Counter", "tests.unit.flaky_env:shout"}
        assert tools.open("ep", {"start": 10}) == "counting from 10"
        assert tools.call("ep", "add", {"n": 1}) == "11"
        outcomes = {name: tools.call("ep", name, {}) for name in ("raises", "hang", "exit", "binary", "hog")}
        assert {n: o.kind for n, o in outcomes.items()} == {
            "raises": "raised", "hang": "timeout", "exit": "died", "binary": "not_text", "hog": "out_of_memory"}
        assert "KeyError" in outcomes["raises"].message and "died (exit code 3)" in outcomes["exit"].message
        flood = tools.call("ep", "flood", {})
        assert flood.startswith("y" * 1000) and flood.endswith("[... 199000 more characters cut ...]")
        assert tools.call("ep", "shout", {"text": "ok"}) == "OK"
        # three replacements (hang, exit, hog), each rebuilt the episode from its row and its calls
        assert tools.restarts == 3 and tools.call("ep", "add", {"n": 1}) == "12" and tools.reward("ep") == 12.0
        assert tools.failures == {"raised": 1, "timeout": 1, "died": 1, "not_text": 1, "out_of_memory": 1}
        tools.close("ep")
    finally:
        tools.shutdown()


def test_an_environment_that_cannot_be_used_is_refused_before_any_episode():
    with pytest.raises(ToolError, match="cannot import 'tests.unit.flaky_env:Nope'"):
        ToolProcess(environment="tests.unit.flaky_env:Nope")
    with pytest.raises(ToolError, match="undocumented: has no docstring"):
        ToolProcess(tools=["tests.unit.flaky_env:undocumented"])
    tools = ToolProcess(environment="posttrain.envs.builtin:GuessNumber")
    try:
        assert tools.specs == [] and tools.has_step
        with pytest.raises(EpisodeError, match=r"episode g0: posttrain.envs.builtin:GuessNumber.reset failed: "
                                               r"ValueError: a guess_number row needs"):
            tools.open("g0", {"low": 1, "high": 8, "secret": 9, "max_turns": 3})
        assert tools.open("g1", {"low": 1, "high": 8, "secret": 3, "max_turns": 3}).startswith("Guess the number")
        assert tools.step("g1", "4").observation == "lower"
    finally:
        tools.shutdown()
