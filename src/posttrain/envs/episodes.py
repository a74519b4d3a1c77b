"""Multi-turn episodes, token-exact: the model samples a turn, the environment answers (a tool's result, or
its `step`'s observation), the answer is appended AS TOKENS, and the model samples the next turn from
exactly the ids it will be trained on.

    layout = EpisodeLayout.check(tokenizer, stop_ids)        # at plan: refused if the template cannot do it
    env = LocalEnv(ToolProcess(environment="pkg:Env"))       # or the RL run's environment role (batched, remote)
    episodes = run_episodes(engine, layout, env, rows, messages, n=4, limits=EpisodeLimits(...), ...)
    episodes[i].response_ids, .logprobs, .sampled           # sampled == 1: the policy's; 0: the environment's

Who does what: the driver of `run_episodes` holds the tokens (it samples, appends, renders the environment's
turn with the layout); the environment (`EpisodeEnv`: `open`, `respond`, `finish`, batched over episodes) holds
the instances and answers a finished turn with text - a tool's result, a `step`'s observation, or "that was
the answer". `LocalEnv` is that over one tool process; the RL run's environment role shards it over workers.

Token-exactness: a sampled turn's ids are kept as sampled - never decoded and re-tokenized (the trainer would
score different tokens than were sampled: TRL #5224). Only the environment's text is tokenized, and only
once: its turn is rendered by the model's OWN chat template as the text that follows a finished assistant
turn (`EpisodeLayout.env_text`), so the ids the model continues from are the ids of the rendered
conversation up to the sampled tokens. The per-token `sampled` mask keeps the environment's tokens out of
every loss and metric.

The template must render a conversation's prefix as a prefix of the whole (checked on a three-turn episode),
and what it renders after an assistant message must start with one of the model's stop tokens (the turn
ended there); a template that does not is refused at plan, naming what it rendered. Tools are shown in the
documented format of `posttrain.envs.calls` as ordinary turns, so a template that drops `tools` and `tool`
turns (SmolLM2's) works the same way - never a silent drop.

Limits (`EpisodeLimits`): turns per episode, tokens per sampled turn, tokens of one environment answer (cut
with a visible marker), and total response tokens (an episode reaching it ends, unfinished).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from posttrain.envs.calls import CallError, parse_call, response_turn, tools_block
from posttrain.envs.host import ToolFailure
from posttrain.envs.tools import ToolError, ToolSpec
from posttrain.models.generate import Sampler

_MARK = "\u2063MARK\u2063"
"""A content string no template rewrites, to find where the template puts an assistant message's content."""


@dataclass(frozen=True, kw_only=True)
class EnvReply:
    """The environment's answer to one finished turn."""
    answer: str | None
    """The text the model reads next (a tool's result, an error the model made or a tool's failure, an
    observation); None: the turn was the episode's answer (no tool call, or the environment ended it)."""
    tool_call: bool = False
    """The turn called a tool (well-formed or not)."""
    failure: str | None = None
    """Why the call failed: the tool process's kind (raised, timeout, died, out_of_memory, not_text,
    unknown_tool) or the model's own (bad_call)."""
    reward: float | None = None
    """A per-turn reward the environment's `step` gave."""


@dataclass(frozen=True, kw_only=True)
class EpisodeEnd:
    """What the environment says when an episode is over."""
    reward: float | None
    """The episode's own reward (`get_reward()`), or None without one."""


class EpisodeEnv(Protocol):
    """The environment side of episodes, batched: each call takes the keys of several episodes."""

    specs: list[ToolSpec]
    """The tools the model is shown (empty for an environment that only has `step`)."""

    def open(self, keys: Sequence[str], rows: Sequence[dict]) -> list[str | None]:
        """A fresh instance per key, reset with its row; each one's first observation or None."""
        ...

    def respond(self, keys: Sequence[str], texts: Sequence[str]) -> list[EnvReply]:
        """Each episode's answer to the turn the model just finished (`texts`: its decoded text)."""
        ...

    def finish(self, keys: Sequence[str]) -> list[EpisodeEnd]:
        """Each episode's own reward, then its instance is closed."""
        ...


class LocalEnv:
    """EpisodeEnv over one tool host in this process's reach: a ToolProcess (the user's code in its sandboxed
    child) or an EnvironmentHost (in-process: tests). A tool call in the documented format runs the tool; a
    turn without one is the answer; with a `step`, every turn goes to `step` instead."""

    def __init__(self, tools):
        self.tools, self.specs = tools, tools.specs

    def open(self, keys, rows):
        return [self.tools.open(k, r) for k, r in zip(keys, rows)]

    def respond(self, keys, texts):
        return [self._respond(k, t) for k, t in zip(keys, texts)]

    def _respond(self, key: str, text: str) -> EnvReply:
        if self.tools.has_step:
            r = self.tools.step(key, text)
            return EnvReply(answer=None if r.done else r.observation, reward=r.reward)
        call = parse_call(text, self.specs)
        if call is None:
            return EnvReply(answer=None)
        if isinstance(call, CallError):
            return EnvReply(answer=f"error: {call.message}", tool_call=True, failure="bad_call")
        out = self.tools.call(key, call.name, call.arguments)
        if isinstance(out, ToolFailure):
            return EnvReply(answer=f"error: {out.message}", tool_call=True, failure=out.kind)
        return EnvReply(answer=out, tool_call=True)

    def finish(self, keys):
        """Every key's instance is closed, even after one's `get_reward` failed (that error is raised after)."""
        ends, error = [], None
        for k in keys:
            try:
                ends.append(EpisodeEnd(reward=self.tools.reward(k) if self.tools.has_reward else None))
            except Exception as e:  # noqa: BLE001 - re-raised once every instance is closed
                error = error or e
            finally:
                self.tools.close(k)
        if error is not None:
            raise error
        return ends


@dataclass(frozen=True, kw_only=True)
class EpisodeLimits:
    max_turns: int = 4
    """Sampled turns per episode (the last one is the answer whatever it says)."""
    max_new_tokens: int = 32
    """Tokens per sampled turn."""
    max_env_tokens: int = 64
    """Tokens of one environment answer; a longer one is cut with a visible marker."""
    max_total_tokens: int = 256
    """Response tokens per episode (sampled and environment); the episode ends unfinished at this."""


@dataclass
class Episode:
    """One episode's tokens and what happened in it."""
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """Per response token: the sampled log-prob; 0.0 on the environment's tokens."""
    sampled: list[int] = field(default_factory=list)
    """Per response token: 1 sampled by the policy, 0 came from the environment."""
    finished: bool = False
    """The last turn ended at a stop token (or the environment ended the episode)."""
    turns: int = 0
    tool_calls: int = 0
    tool_failures: dict[str, int] = field(default_factory=dict)
    """Failed calls by kind: the tool process's (raised, timeout, died, ...) and the model's own (bad_call)."""
    step_rewards: list[float] = field(default_factory=list)
    """Per-turn rewards an environment's `step` gave."""
    env_reward: float | None = None
    """The episode's own reward (`get_reward()`), read when it ended; None without one."""
    transcript: list[tuple[str, str]] = field(default_factory=list)
    """(who, text) in order: ("policy", turn text), ("tool", result), ("env", observation)."""
    turn_starts: list[int] = field(default_factory=list)
    """Where each sampled turn begins in response_ids: turn j was sampled by the engine's j-th `generate` call
    of the episodes (every turn is one call for all episodes still going)."""
    final_text: str = ""
    """The last sampled turn's text: what a verifier or reward function scores."""


class EpisodeLayout:
    """How episodes are rendered for one tokenizer: the prompt (tools shown in a system turn, the first
    observation appended to the last user turn) and the environment's turns as the text after a finished
    assistant turn."""

    def __init__(self, tokenizer, stop_ids: list[int], after_stop: dict[int, str]):
        self.tokenizer, self.stop_ids, self._after_stop = tokenizer, list(stop_ids), after_stop
        self._turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK}]
        self._before = _render(tokenizer, self._turn, gen=False)
        """A finished assistant turn, rendered once: each environment turn is what the template adds after it."""

    @classmethod
    def check(cls, tokenizer, stop_ids: list[int], name: str = "the model's chat template") -> EpisodeLayout:
        """The layout, or a ToolError naming what the template does that episodes cannot use."""
        # the environment's turns: a tool's result, or a step's observation as a plain user turn
        for env_turn in (response_turn, lambda text: {"role": "user", "content": text}):
            msgs = [{"role": "user", "content": "question"}, {"role": "assistant", "content": _MARK},
                    env_turn("result"), {"role": "assistant", "content": _MARK + "2"}, env_turn("again")]
            renders = [_render(tokenizer, msgs[:k], gen=msgs[k - 1]["role"] != "assistant") for k in range(1, 6)]
            for k in range(1, 5):
                if not renders[k].startswith(renders[k - 1]):
                    raise ToolError(f"{name} does not render an episode's earlier turns as a prefix of the later "
                                    f"ones (turn {k + 1} re-renders turn {k}): multi-turn episodes cannot keep the "
                                    "sampled tokens as sampled with it")
        tail = renders[1][renders[1].rindex(_MARK) + len(_MARK):]  # what follows an assistant message
        after = {}
        for s in stop_ids:
            text = tokenizer.decode([s], skip_special_tokens=False)
            if text and tail.startswith(text):
                after[s] = tail[len(text):]
        if not after:
            raise ToolError(f"{name} ends an assistant turn with {tail!r}, which starts with none of the model's "
                            f"stop tokens {stop_ids}: an episode's turn cannot end where the template ends it")
        return cls(tokenizer, stop_ids, after)

    @property
    def turn_stops(self) -> set[int]:
        """The stop ids that end a turn (the template's end of an assistant message starts with them)."""
        return set(self._after_stop)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[dict], specs: list[ToolSpec], first_observation: str | None) -> list[int]:
        """The episode's first context: tools in a system turn (merged into the row's own system turn, unless
        that turn already shows exactly these tools - a demonstration written as episodes render them, as the
        built-in tasks' are), the environment's first observation appended to the last user turn (unless that
        turn already ends with it: guess_number's demonstrations open on the game's own first observation)."""
        msgs = [dict(m) for m in messages]
        if first_observation:
            last = max(i for i, m in enumerate(msgs) if m["role"] == "user")
            if not msgs[last]["content"].endswith(first_observation):
                msgs[last]["content"] = f"{msgs[last]['content']}\n\n{first_observation}"
        if specs:
            block = tools_block(specs)
            if msgs and msgs[0]["role"] == "system":
                if not msgs[0]["content"].endswith(block):
                    msgs[0]["content"] = f"{msgs[0]['content']}\n\n{block}"
            else:
                msgs.insert(0, {"role": "system", "content": block})
        return self.encode(_render(self.tokenizer, msgs, gen=True))

    def env_ids(self, stop_id: int, text: str, tool: bool = True) -> list[int]:
        """The ids after a turn that ended at `stop_id`: the rest of the template's end of turn, the
        environment's turn - a tool's result in the tool-response format, or (`tool` False) an observation of
        `step` as a plain user turn - and the next generation prompt."""
        turn = response_turn(text) if tool else {"role": "user", "content": text}
        after = _render(self.tokenizer, [*self._turn, turn], gen=True)
        return self.encode(self._after_stop[stop_id] + after[len(self._before):])

    def cut(self, text: str, max_tokens: int) -> str:
        """An environment answer cut to `max_tokens` tokens, with a visible marker."""
        ids = self.encode(text)
        if len(ids) <= max_tokens:
            return text
        return self.tokenizer.decode(ids[:max_tokens]) + f" [... {len(ids) - max_tokens} more tokens cut]"


def _render(tokenizer, messages: list[dict], gen: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)


def run_episodes(engine: Sampler, layout: EpisodeLayout, env: EpisodeEnv, rows: list[dict],
                 messages: list[list[dict]], *, n: int, limits: EpisodeLimits, temperature: float, seed: int,
                 top_p: float = 1.0, top_k: int = 0, key_prefix: str = "ep") -> list[Episode]:
    """n episodes per row (row-major, as `generate` orders samples), every turn batched across the episodes
    still going: one `generate` and one `respond` per turn."""
    keys = [f"{key_prefix}-{i}-{j}" for i in range(len(rows)) for j in range(n)]
    row_of = [i for i in range(len(rows)) for _ in range(n)]
    firsts = env.open(keys, [rows[i] for i in row_of])
    try:
        episodes = [Episode(prompt_ids=layout.prompt_ids(
            messages[i], env.specs, None if first is None else layout.cut(first, limits.max_env_tokens)))
                    for i, first in zip(row_of, firsts)]
        active = list(range(len(episodes)))
        for turn in range(limits.max_turns):
            if not active:
                break
            gens = engine.generate([episodes[e].prompt_ids + episodes[e].response_ids for e in active], n=1,
                                   temperature=temperature, max_new_tokens=limits.max_new_tokens,
                                   seed=seed + 1_000_003 * turn, top_p=top_p, top_k=top_k)
            asking = [e for e, g in zip(active, gens) if _sampled_turn(episodes[e], g, layout, limits)]
            replies = env.respond([keys[e] for e in asking], [episodes[e].final_text for e in asking])
            active = [e for e, r in zip(asking, replies)
                      if _env_turn(episodes[e], r, layout, limits, last=turn == limits.max_turns - 1)]
    finally:
        ends = env.finish(keys)
    for ep, end in zip(episodes, ends):
        ep.env_reward = end.reward
    return episodes


def _sampled_turn(ep: Episode, g, layout: EpisodeLayout, limits: EpisodeLimits) -> bool:
    """Append one sampled turn. True: it ended the turn at a turn-stop, so the environment answers it."""
    room = limits.max_total_tokens - len(ep.response_ids)
    ids, lps = list(g.response_ids[:room]), list(g.logprobs[:room])
    ep.turn_starts.append(len(ep.response_ids))
    ep.response_ids += ids
    ep.logprobs += lps
    ep.sampled += [1] * len(ids)
    ep.turns += 1
    text = layout.tokenizer.decode(ids, skip_special_tokens=True)
    ep.transcript.append(("policy", text))
    ep.final_text = text
    if not (bool(ids) and g.finished and len(ids) == len(g.response_ids)):
        return False  # ran out of tokens mid-turn: the episode ends unfinished
    if ids[-1] not in layout.turn_stops:  # a stop that ends the whole text, not the turn: a final answer
        ep.finished = True
        return False
    return True


def _env_turn(ep: Episode, r: EnvReply, layout: EpisodeLayout, limits: EpisodeLimits, last: bool) -> bool:
    """Record the environment's reply and append its turn as tokens. True: the episode goes on."""
    if r.reward is not None:
        ep.step_rewards.append(r.reward)
    if r.tool_call:
        ep.tool_calls += 1
    if r.failure:
        ep.tool_failures[r.failure] = ep.tool_failures.get(r.failure, 0) + 1
    if r.answer is None:  # the turn was the answer (or the environment ended the episode)
        ep.finished = True
        return False
    ep.transcript.append(("tool" if r.tool_call else "env", r.answer))
    if last:  # the environment answered the last turn the episode has: it ends without a final answer
        return False
    env = layout.env_ids(ep.response_ids[-1], layout.cut(r.answer, limits.max_env_tokens), tool=r.tool_call)
    if len(ep.response_ids) + len(env) >= limits.max_total_tokens:
        return False
    ep.response_ids += env
    ep.logprobs += [0.0] * len(env)
    ep.sampled += [0] * len(env)
    return True
