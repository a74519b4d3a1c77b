"""OpenEnv environments run unchanged (posttrain.envs.openenv): environments written against openenv-core's own
classes (tests/unit/openenv_envs.py: an MCP tool environment, a text game, an environment with a structured
Action) run in the sandboxed tool process and in token-exact episodes of the real tiny model. Needs the
optional extra's environment (make test-openenv); skipped elsewhere."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openenv", reason="the optional openenv extra is not installed (make test-openenv runs these)")
pytestmark = pytest.mark.openenv

from posttrain.envs.episodes import EpisodeLayout, EpisodeLimits, LocalEnv, run_episodes
from posttrain.envs.host import ToolFailure
from posttrain.envs.process import ToolLimits, ToolProcess
from posttrain.envs.tools import ToolError

ENVS = "tests.unit.openenv_envs"


@pytest.fixture
def process(request):
    made = []

    def start(name: str) -> ToolProcess:
        made.append(ToolProcess(environment=f"{ENVS}:{name}", limits=ToolLimits(timeout_s=60)))
        return made[-1]

    yield start
    for p in made:
        p.shutdown()


def test_an_mcp_environments_tools_are_the_episodes_tools_and_its_errors_the_models(process):
    tools = process("CalculatorMCP")
    assert [s.name for s in tools.specs] == ["multiply", "divide", "submit"] and not tools.has_step
    assert tools.specs[0].parameters["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}
    assert tools.specs[0].schema["function"]["description"] == "Multiply two integers."
    assert set(tools.identity) == {f"{ENVS}:CalculatorMCP"}
    assert tools.open("e", {"answer": "408", "question": "12 * 34"}) is None  # an observation without text
    assert tools.call("e", "multiply", {"a": 12, "b": 34}) == "408"
    zero = tools.call("e", "divide", {"a": 1, "b": 0})
    assert isinstance(zero, ToolFailure) and zero.kind == "raised" and "execution_error" in zero.message
    assert zero.message == "execution_error: Error calling tool 'divide': integer division or modulo by zero"
    bad = tools.call("e", "multiply", {"a": "x", "b": 2})  # the MCP server validates the arguments
    assert isinstance(bad, ToolFailure) and "validation error for call[multiply]" in bad.message
    assert tools.call("e", "search", {}).kind == "unknown_tool"
    assert tools.call("e", "submit", {"answer": 408}) == "submitted"
    after = tools.call("e", "multiply", {"a": 1, "b": 1})  # submit returned done: the episode is over
    assert isinstance(after, ToolFailure) and "has ended the episode" in after.message
    assert tools.reward("e") == 1.0
    tools.close("e")
    tools.open("f", {"answer": "5"})
    assert tools.call("f", "submit", {"answer": 4}) == "submitted" and tools.reward("f") == 0.0
    assert tools.failures == {"raised": 3, "unknown_tool": 1}


def test_a_text_environment_takes_each_turn_as_its_action(process):
    game = process("NumberGame")
    assert game.specs == [] and game.has_step and not game.has_reward
    assert game.open("g", {"secret": 3, "intro": "Guess a number between 1 and 8."}).startswith("Guess a number")
    assert game.open("h", {"secret": 3}) is None  # an observation with no text: the row's prompt opens the episode
    r = game.step("g", "I guess 5")
    assert (r.observation, r.reward, r.done) == ("lower", 0.0, False)
    r = game.step("g", "3")
    assert (r.observation, r.reward, r.done) == ("correct", 1.0, True)


def test_a_structured_action_is_one_tool_and_a_bad_one_is_answered(process):
    walk = process("LineWalk")
    (spec,) = walk.specs
    assert spec.name == "move" and spec.schema["function"]["description"] == "Move along the line."
    props = spec.parameters["properties"]
    assert set(props) == {"direction", "steps"} and props["direction"]["enum"] == ["left", "right"]
    assert spec.parameters["required"] == ["direction", "steps"]
    assert json.loads(walk.open("w", {"target": 4})) == {"position": 0, "target": 4}
    call = '<tool_call>{"name": "move", "arguments": {"direction": "right", "steps": 3}}</tool_call>'
    r = walk.step("w", "Going right. " + call)
    assert json.loads(r.observation) == {"position": 3, "target": 4} and (r.reward, r.done) == (0.0, False)
    r = walk.step("w", '<tool_call>{"name": "move", "arguments": {"direction": "up", "steps": 9}}</tool_call>')
    assert r.observation.startswith("error: move:") and "direction" in r.observation and "steps" in r.observation
    assert walk.step("w", "right, one step").observation == "error: the turn made no call; act by calling move"
    r = walk.step("w", call.replace("3", "1"))
    assert json.loads(r.observation)["position"] == 4 and (r.reward, r.done) == (1.0, True)


def test_an_environment_whose_action_cannot_be_read_is_refused_naming_it():
    with pytest.raises(ToolError, match=r"NoActionType is an OpenEnv environment whose Action class cannot be read"):
        ToolProcess(environment=f"{ENVS}:NoActionType")


def test_the_tiny_model_plays_an_openenv_game_token_exactly(tiny_sft_model, process):
    from posttrain.rl.roles.rollout import TransformersEngine

    engine = TransformersEngine(str(tiny_sft_model["model_dir"]), device="cpu")
    layout = EpisodeLayout.check(engine.tokenizer, engine.eos_ids)
    env = LocalEnv(process("NumberGame"))
    # the model answers "46" to its own task: wrong for every secret here, so the game answers and it plays on
    eps = run_episodes(engine, layout, env, [{"secret": 3}, {"secret": 7}], [[{"role": "user", "content": "12+34="}]] * 2,
                       n=2, limits=EpisodeLimits(max_turns=3, max_new_tokens=12, max_total_tokens=200),
                       temperature=1.0, seed=0)
    for e in eps:
        assert e.turns >= 2 and 0 in e.sampled and e.sampled[0] == 1 and len(e.step_rewards) >= 1
        assert all(lp == 0.0 for lp, s in zip(e.logprobs, e.sampled) if not s)  # the game's tokens: not sampled
        assert e.transcript[1][0] == "env" and e.transcript[1][1] in ("higher", "lower", "say a number")
        # the game's turn is the template's rendering of its observation, appended as tokens
        env_ids = [t for t, s in zip(e.response_ids, e.sampled) if not s]
        assert e.transcript[1][1] in engine.tokenizer.decode(env_ids)
