"""Per-row records that cross Ray as ragged lists (one list of floats per response) and the padded (B, R)
tensors the math runs on: the one pair of converters every role and loop uses, and the one row selector
(`take_rows`) for the records themselves."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeVar

import torch

R = TypeVar("R")


def take_rows(record: R, rows: Sequence[int]) -> R:
    """Rows `rows` of a per-row record (PromptBatch, Trajectories, TrainBatch, CriticBatch...), in that order:
    every list field is indexed - a field added to the record later is carried without touching this - and
    every other field (the policy version, the loss settings, timings) is kept. A list field whose length is not
    the record's row count (so not per-row) is refused rather than cut wrongly; None (no ref_logprobs) stays."""
    lists = {f.name: v for f in dataclasses.fields(record) if isinstance(v := getattr(record, f.name), list)}
    n = {len(v) for v in lists.values()}
    if len(n) > 1:
        raise ValueError(f"{type(record).__name__}: list fields of different lengths, so not all per-row: "
                         + ", ".join(f"{k} {len(v)}" for k, v in lists.items()))
    return dataclasses.replace(record, **{k: [v[i] for i in rows] for k, v in lists.items()})


def per_token_versions(record) -> list[list[int]]:
    """The policy version that sampled each response token of a Trajectories or TrainBatch: its
    `token_versions` when an episode spanned a weight update, else each row's `versions` entry, else the
    record's `policy_version` for every token."""
    if getattr(record, "token_versions", None) is not None:
        return record.token_versions
    rows = record.versions if record.versions is not None else [record.policy_version] * len(record.response_ids)
    return [[v] * len(r) for v, r in zip(rows, record.response_ids)]


def all_versions(record) -> set[int]:
    """Every policy version a record's tokens and rows name (per_token_versions and `versions`)."""
    return {v for row in per_token_versions(record) for v in row} | set(record.versions or [])


def trained_tokens(record, i: int) -> int:
    """Row i's tokens a loss (or a token count) is over: the ones the policy sampled (`sampled`, multi-turn
    episodes) when the record has that mask, else its whole response."""
    mask = getattr(record, "sampled", None)
    return sum(mask[i]) if mask is not None else len(record.response_ids[i])


def loss_mask(record, lo: int, hi: int, shape: tuple[int, int] | torch.Size) -> torch.Tensor:
    """(hi - lo, R) bool of rows lo:hi: True on each response's tokens the loss is over - every token up to
    its length, or the sampled ones when the record has a `sampled` mask."""
    mask = getattr(record, "sampled", None)
    rows = mask[lo:hi] if mask is not None else [[1] * len(r) for r in record.response_ids[lo:hi]]
    return pad_rows(rows, shape).bool()


def pad_rows(rows: list[list[float]], shape: tuple[int, int] | torch.Size) -> torch.Tensor:
    """Ragged per-token rows -> (B, R) float32 of `shape`, zeros past each row's end."""
    out = torch.zeros(tuple(shape), dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def rows_of(x: torch.Tensor, response_ids: list[list[int]]) -> list[list[float]]:
    """(B, R) -> ragged per-token rows, each as long as its response."""
    return [x[i, :len(r)].tolist() for i, r in enumerate(response_ids)]
