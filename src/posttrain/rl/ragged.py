"""Per-row records that cross Ray as ragged lists (one list of floats per response) and the padded (B, R)
tensors the math runs on: the one pair of converters every role and loop uses."""

from __future__ import annotations

import torch


def pad_rows(rows: list[list[float]], shape: tuple[int, int] | torch.Size) -> torch.Tensor:
    """Ragged per-token rows -> (B, R) float32 of `shape`, zeros past each row's end."""
    out = torch.zeros(tuple(shape), dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def rows_of(x: torch.Tensor, response_ids: list[list[int]]) -> list[list[float]]:
    """(B, R) -> ragged per-token rows, each as long as its response."""
    return [x[i, :len(r)].tolist() for i, r in enumerate(response_ids)]
