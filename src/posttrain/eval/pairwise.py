"""A reward model's held-out evaluation: how often it scores the chosen completion above the rejected one
(`pairwise_accuracy`) on a preference dataset's eval pairs, and the distribution of both scores.

Scores come from the saved folder through transformers' own pooled forward
(`posttrain.models.reward_model.score_conversations`), exactly what a user of the folder gets - not from the
trainer's per-position head - so a pooling mismatch between training and use would show here.

Leaves out: ties counted as half (a tie is a miss), calibration, and per-prompt breakdowns beyond the samples.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from posttrain.data.examples import is_preference, pair_conversations, read_examples
from posttrain.models.io import load_tokenizer
from posttrain.models.reward_model import load_reward_model, score_conversations

HISTOGRAM_BINS = 20


def evaluate_pairs(rm_dir: str | Path, dataset_dir: str | Path, *, num_pairs: int = 0, batch_size: int = 64) -> dict:
    """{"pairwise_accuracy", "num_pairs", "chosen": {mean, std, min, max}, "rejected": {...}, "margin_mean",
    "histogram": {"edges", "chosen", "rejected"}, "samples": [...], "seconds"} on the dataset's eval pairs."""
    rows = [ex for ex in read_examples(dataset_dir, "eval") if is_preference(ex)]
    if num_pairs:
        rows = rows[:num_pairs]
    if not rows:
        raise ValueError(f"{dataset_dir}: the eval split holds no preference pairs to score")
    t0 = time.perf_counter()
    rm, tok = load_reward_model(rm_dir), load_tokenizer(rm_dir)
    convs = [c for ex in rows for c in pair_conversations(ex)]  # chosen, rejected, chosen, ...
    scores = score_conversations(rm, tok, convs, batch_size=batch_size)
    chosen, rejected = scores[0::2], scores[1::2]
    wins = [c > r for c, r in zip(chosen, rejected)]
    lo, hi = min(scores), max(scores)
    width = (hi - lo) / HISTOGRAM_BINS or 1.0
    edges = [lo + i * width for i in range(HISTOGRAM_BINS + 1)]

    def hist(xs):
        counts = [0] * HISTOGRAM_BINS
        for x in xs:
            counts[min(int((x - lo) / width), HISTOGRAM_BINS - 1)] += 1
        return counts

    def dist(xs):
        return {"mean": statistics.fmean(xs), "std": statistics.pstdev(xs), "min": min(xs), "max": max(xs)}

    samples = [{"prompt": ex["messages"][-1]["content"], "chosen": ex["chosen"][-1]["content"],
                "rejected": ex["rejected"][-1]["content"], "chosen_score": c, "rejected_score": r}
               for ex, c, r in list(zip(rows, chosen, rejected))[:10]]
    return {"pairwise_accuracy": sum(wins) / len(rows), "num_pairs": len(rows), "chosen": dist(chosen),
            "rejected": dist(rejected), "margin_mean": statistics.fmean(c - r for c, r in zip(chosen, rejected)),
            "histogram": {"edges": edges, "chosen": hist(chosen), "rejected": hist(rejected)}, "samples": samples,
            "seconds": time.perf_counter() - t0}
