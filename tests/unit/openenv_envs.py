"""Environments written against openenv-core's own classes, as an OpenEnv user writes them (no posttrain import):
run by posttrain's adapter unchanged (tests/unit/test_openenv.py). Needs the `openenv` extra."""

from __future__ import annotations

from typing import Any, Literal

from fastmcp import FastMCP
from openenv.core.env_server import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    """A guess, as text."""
    message: str = Field(description="The guess")


class GuessObservation(Observation):
    feedback: str = Field(description="higher, lower or correct")


class NumberGame(Environment[GuessAction, GuessObservation, State]):
    """Guess a number; the reward comes with the step that solves it."""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self.secret, self._state = int(kwargs["secret"]), State(episode_id=episode_id)
        return GuessObservation(feedback=kwargs.get("intro", ""))  # no text: the episode opens on the row's prompt

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        digits = "".join(ch for ch in action.message if ch.isdigit())
        if not digits:
            return GuessObservation(feedback="say a number")
        guess = int(digits)
        if guess == self.secret:
            return GuessObservation(feedback="correct", done=True, reward=1.0)
        return GuessObservation(feedback="higher" if guess < self.secret else "lower", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class MoveAction(Action):
    """Move along the line."""
    direction: Literal["left", "right"] = Field(description="Which way to move")
    steps: int = Field(ge=1, le=3, description="How far, 1 to 3")


class LineObservation(Observation):
    position: int
    target: int


class LineWalk(Environment[MoveAction, LineObservation, State]):
    """Walk to the target; done there, with a reward."""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> LineObservation:
        self.position, self.target, self._state = 0, int(kwargs.get("target", 4)), State()
        return LineObservation(position=self.position, target=self.target)

    def step(self, action: MoveAction, timeout_s: float | None = None, **kwargs: Any) -> LineObservation:
        self.position += action.steps if action.direction == "right" else -action.steps
        done = self.position == self.target
        return LineObservation(position=self.position, target=self.target, done=done, reward=1.0 if done else 0.0)

    @property
    def state(self) -> State:
        return self._state


class CalculatorMCP(MCPEnvironment):
    """Arithmetic as MCP tools; `submit` ends the episode with a reward for the right answer."""

    def __init__(self):
        mcp = FastMCP("calculator")

        @mcp.tool
        def multiply(a: int, b: int) -> int:
            """Multiply two integers."""
            return a * b

        @mcp.tool
        def divide(a: int, b: int) -> int:
            """Integer division."""
            return a // b

        @mcp.tool
        def submit(answer: int) -> str:
            """Give the final answer."""
            return "submitted"

        super().__init__(mcp)
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self.answer = int(kwargs["answer"])
        return Observation()

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        obs = super().step(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction) and action.tool_name == "submit":
            obs.reward, obs.done = float(action.arguments.get("answer") == self.answer), True
        return obs

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation()

    @property
    def state(self) -> State:
        return self._state


class NoActionType(Environment):
    """An OpenEnv environment whose Action cannot be read (no annotation, no generic arguments)."""

    def reset(self, seed=None, episode_id=None, **kwargs):
        return Observation()

    def step(self, action, timeout_s=None, **kwargs):
        return Observation()

    @property
    def state(self):
        return State()
