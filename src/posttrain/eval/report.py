"""The evaluation report: what was measured, how, and a few samples for a human to read."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class EvalReport:
    greedy_accuracy: float
    """Fraction of problems whose greedy completion scores >= 1.0."""
    sampled_accuracy: float | None
    """Mean correctness over k samples per problem at `temperature` (None when k == 0: greedy only)."""
    pass_at_k: float | None
    """Fraction of problems with at least one correct sample among the k (None when k == 0)."""
    num_problems: int
    k: int
    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int
    seed: int
    scorer: str
    """"verifier:<task>" or the user reward function's import path."""
    reward_calls: int = 0
    """Completions scored (greedy + k per problem)."""
    reward_failures: int = 0
    """Reward calls that failed (raised, timed out, died, returned a non-number); counted as incorrect."""
    reward_failure_examples: list[str] = field(default_factory=list)
    """Up to 5 distinct failure reasons."""
    mean_response_tokens: float
    seconds: float
    generated_tokens_per_s: float
    samples: list[dict] = field(default_factory=list)
    """The first 10 problems: prompt, answer, greedy completion, score, correct, failure."""
    problems: list[dict] = field(default_factory=list)
    """Every problem scored, as in `samples`, plus `sampled_correct`: how many of the k samples were correct
    (None when k == 0). Reports written before this field have none. In an environment each also has
    `episode`: its greedy episode turn by turn, [[who, text]...] (who: policy, tool or env), and `greedy` is
    the episode's last sampled turn."""
    episodes: dict | None = None
    """With eval.environment / eval.tools (posttrain.eval.episodes.episode_summary), over every episode (greedy
    and sampled): environment, tools (the names of those the model was shown), episodes, turns_mean,
    tool_calls_mean, tool_failures {kind: n}, finished, env_reward_mean (None without the environment's own
    rewards). None: no environment."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> EvalReport:
        return cls(**json.loads(text))

    def write(self, out_dir: str | Path) -> Path:
        path = Path(out_dir) / "report.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path
