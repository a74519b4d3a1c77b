"""Scoring completions: the built-in verifiers, or a user reward function run in a killable child process.

    scorer = RewardScorer(reward_cfg)                      # RL's reward workers and eval both use this
    scorer.check_arguments(["meta", "difficulty"])         # before any work: can every call be made?
    results = scorer.score([RewardSample.from_example(example, completion), ...])   # -> list[RewardResult]

With `reward.fn == ""` the task's built-in verifier (`posttrain.data.verifiers.score`) scores in-process
(trusted code). Otherwise `reward.fn` names a user function as `module:function` (imported, never eval'ed)
in ONE spawned child process whose `sys.path` starts with the `reward.python_path` folders; the parent never
imports user code. The call convention is read from the function's signature (`inspect.signature`):

- per sample (default): the function is called with the arguments it names, taken from
  `prompt` (text of the last user turn), `messages` (the prompt turns, [{role, content}]), `completion`
  (decoded text), `answer` (reference or None), `task`, and every key of the example's "columns" by its own
  name (the five reserved names win over a column of the same name). `**kwargs` receives all of them.
  A required parameter that no row can supply is refused by `check_arguments` before any work; one that a
  single row lacks is a recorded failure for that row.
- batch (TRL style): a function whose first two parameters are `prompts, completions` is called once per
  `score` call with lists (`prompts` = last user turn texts, `completions` = decoded texts) and every other
  argument it names (or, with `**kwargs`, every available one) as a list per name (None where a row lacks
  the column). It must return a list of the same length.

A score is a finite real number (int or float; a bool is NOT a score). Anything else - None, a string,
NaN, inf, a wrong-length batch -, an exception (BaseException, so `sys.exit` too), a dead child (`os._exit`,
`os.abort`, a segfault) and a call that overruns `reward.timeout_s` (wall, per call; per batch for a batch
function), `reward.cpu_s` (CPU time per call) or `reward.memory_mb` become a `RewardResult` with score 0.0 and
the failure's reason; on a timeout, death or out-of-memory the child is killed and a fresh one started, so
user code can neither crash nor hang a run (after MAX_TIMEOUTS_PER_SCORE timeouts in one `score` call the
rest of that batch fails without being called). What the function prints goes to stderr. Messages between
the processes are JSON (no pickle), so the row's columns must be JSON values, as the dataset contract
requires. The built-in verifiers never raise on any text (tests/unit/test_verifiers.py fuzzes them); should
one raise anyway, that sample is a recorded failure, not a crash.

Leaves out: network and filesystem isolation - the child is a plain process of the same user, killed with
its parent on Linux.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from posttrain.config import RewardConfig
from posttrain.rewards.sandbox import Limits, RewardFunctionError, RewardProcess, check_name

__all__ = ["MAX_TIMEOUTS_PER_SCORE", "RESERVED", "RewardFunctionError", "RewardResult", "RewardSample",
           "RewardScorer", "reward_identity"]

RESERVED = ("prompt", "messages", "completion", "answer", "task")
"""Argument names the scorer supplies itself; they win over a column of the same name."""
BUILTIN = "posttrain.data.verifiers:score"
MAX_TIMEOUTS_PER_SCORE = 3
"""After this many timed-out calls within one `score` call, its remaining samples are recorded as failures
without calling the function: a function that always hangs costs 3 x timeout_s per batch, not one timeout
per sample (which would outlast the RL stage's own remote-call timeout)."""


@dataclass(frozen=True, kw_only=True)
class RewardSample:
    """One completion to score, with the example it answers."""

    completion: str
    """Decoded completion text (special tokens skipped)."""
    messages: list[dict]
    """The prompt turns [{role, content}] the completion answers (without a final assistant turn)."""
    answer: str | None = None
    task: str | None = None
    columns: dict = field(default_factory=dict)
    """Every other column of the user's source row (JSON values); {} for built-in tasks."""

    @classmethod
    def from_example(cls, example: dict, completion: str) -> RewardSample:
        """From a dataset example row ({"messages", "answer", "task", "columns"}; "columns" may be missing)."""
        from posttrain.data.examples import prompt_messages

        return cls(completion=completion, messages=prompt_messages(example), answer=example.get("answer"),
                   task=example.get("task"), columns=example.get("columns") or {})

    def arguments(self) -> dict:
        """Every argument a per-sample function may name."""
        users = [m["content"] for m in self.messages if m.get("role") == "user"]
        return {**self.columns, "prompt": users[-1] if users else "", "messages": self.messages,
                "completion": self.completion, "answer": self.answer, "task": self.task}


@dataclass(frozen=True)
class RewardResult:
    score: float
    """The function's score; 0.0 when the call failed."""
    failure: str | None
    """None, or why the call failed ("ValueError: ... (file.py:12)", "timed out after 5s ...", ...)."""


class RewardScorer:
    """The one scoring entry point of RL's reward workers and of eval. Use as a context manager, or call
    close(), to end the child process."""

    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg
        self.name = cfg.fn or BUILTIN
        """What scores: the user's `module:function`, or the built-in verifiers."""
        self._box: RewardProcess | None = None
        if not cfg.fn:
            return
        missing = [p for p in cfg.python_path if not Path(p).is_dir()]
        if missing:
            raise RewardFunctionError(f"reward.python_path: {missing} not found (or not a folder) on this machine"
                                      f" ({os.uname().nodename}); every entry must exist where RL and eval run")
        check_name(cfg.fn)
        self._box = RewardProcess(cfg.fn, [str(Path(p).resolve()) for p in cfg.python_path],
                                  Limits(memory_mb=cfg.memory_mb, cpu_s=cfg.cpu_s))

    @property
    def identity(self) -> dict:
        """{"import_path", "source_sha256"} of the function's module (or of posttrain/data/verifiers.py)."""
        if self._box is not None:
            return dict(self._box.identity)
        from posttrain.data import verifiers

        src = Path(verifiers.__file__).read_bytes()
        return {"import_path": BUILTIN, "source_sha256": hashlib.sha256(src).hexdigest()}

    @property
    def batch(self) -> bool:
        return self._box is not None and self._box.signature.batch

    def check_arguments(self, columns) -> None:
        """Refuse a function with a required parameter that neither the scorer nor any column supplies."""
        if self._box is None:
            return
        available = sorted(set(RESERVED) | set(columns))
        missing = [p for p in self._box.signature.required if p not in available]
        if missing:
            kind = "batch function" if self.batch else "function"
            raise RewardFunctionError(
                f"reward.fn: {self.name} ({kind}) requires parameter(s) {missing}, which no row supplies; "
                f"available argument names: {available} (the reserved ones plus the dataset's columns)")

    def score(self, samples: list[RewardSample]) -> list[RewardResult]:
        if not samples:
            return []
        if self._box is None:
            from posttrain.data import verifiers

            return [_builtin(verifiers.score, s) for s in samples]
        if self.batch:
            return self._score_batch(samples)
        out: list[RewardResult] = []
        timeouts = 0
        for s in samples:
            if timeouts >= MAX_TIMEOUTS_PER_SCORE:
                out.append(RewardResult(0.0, f"not called: {timeouts} calls in this batch timed out already"))
                continue
            r = self._score_one(s)
            timeouts += r.failure is not None and r.failure.startswith("timed out")
            out.append(r)
        return out

    def _score_one(self, s: RewardSample) -> RewardResult:
        sig, args = self._box.signature, s.arguments()
        absent = [p for p in sig.required if p not in args]
        if absent:
            return RewardResult(0.0, f"row has no column {absent[0]!r} (a required parameter of {self.name})")
        names = args.keys() if sig.var_kw else [*sig.required, *sig.optional]
        kwargs = {k: args[k] for k in names if k in args}
        (score, failure), = self._box.call("call", kwargs, 1, self.cfg.timeout_s)
        return RewardResult(score, failure)

    def _score_batch(self, samples: list[RewardSample]) -> list[RewardResult]:
        sig, rows = self._box.signature, [s.arguments() for s in samples]
        if sig.var_kw:
            names = sorted({k for r in rows for k in r} - {"prompt", "completion"})
        else:
            names = [k for k in (*sig.required, *sig.optional) if k in sig.required or any(k in r for r in rows)]
        kwargs = {"prompts": [r["prompt"] for r in rows], "completions": [r["completion"] for r in rows],
                  **{k: [r.get(k) for r in rows] for k in names}}
        return [RewardResult(s, f) for s, f in self._box.call("batch", kwargs, len(rows), self.cfg.timeout_s)]

    def close(self) -> None:
        if self._box is not None:
            self._box.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _builtin(score, s: RewardSample) -> RewardResult:
    """A built-in verifier's score; an exception (a bug: they are fuzzed not to raise) is a recorded failure."""
    try:
        return RewardResult(score(s.task, s.completion, s.answer), None)
    except Exception as e:  # noqa: BLE001 - one bad sample must not end a run or an eval
        return RewardResult(0.0, f"built-in verifier raised {type(e).__name__}: {e}")


def reward_identity(cfg: RewardConfig) -> dict:
    """{"import_path", "source_sha256"} of the configured scorer (the user function is imported in a
    short-lived child, never in this process)."""
    with RewardScorer(cfg) as scorer:
        return scorer.identity
