"""A multi-turn environment for the RL tests, over any prompt/answer data (the default's 2-digit sums): each
turn is an attempt at the answer; a wrong one is told "no" and may try again, up to its turns. The reward: 1 for
the right answer on the first attempt, less for each further one, 0 if never right. Imported by import path
(rl.environment = "retry_env:Retry", rl.episode.python_path = [this folder]) in the workers' tool processes."""

from __future__ import annotations


class Retry:
    def reset(self, answer: str) -> None:
        self.answer, self.attempts, self.solved = answer.strip(), 0, False

    def step(self, text: str) -> dict:
        self.attempts += 1
        self.solved = text.strip() == self.answer
        return {"observation": "" if self.solved else "no", "done": self.solved}

    def get_reward(self) -> float:
        return 0.0 if not self.solved else 1.0 / self.attempts
