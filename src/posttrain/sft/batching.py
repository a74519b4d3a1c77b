"""Sharding the data across ranks, and collating micro-batches (padded or packed).

Packing puts several examples in one row. Restarting position ids alone do NOT stop packed examples from
attending to each other in HF attention (measured: logits differ by ~0.4), so every batch carries a 4D
additive block-diagonal causal mask `(B, 1, T, T)` (0 = attend, -inf = blocked) together with the position
ids; padded batches use the same mask shape, so one code path serves both.

Objectives that score whole sequences (DPO's log-probs of a completion, a reward model's score) find each
sequence in a batch through `seq_index` (which sequence every position belongs to) and `pool_index` (where each
sequence's score is read), so they work on packed rows as well as padded ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100


def rank_order(n: int, epoch: int, seed: int, rank: int, world: int) -> list[int]:
    """This rank's example indices for `epoch`: a seeded permutation dealt round-robin, equal length per
    rank (the remainder is dropped), so no example is seen twice in an epoch and ranks never overlap."""
    g = torch.Generator().manual_seed(seed * 100003 + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    per_rank = n // world
    return perm[rank::world][:per_rank]


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # (B, T)
    labels: torch.Tensor  # (B, T) next-token targets, IGNORE where no loss
    position_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, 1, T, T) additive float
    num_loss_tokens: int
    num_tokens: int
    seq_index: torch.Tensor | None = None  # (B, T) which of the collated sequences a position holds, -1 = padding
    pool_index: torch.Tensor | None = None  # (N,) flat index into (B * T): each sequence's last non-pad token

    @property
    def num_sequences(self) -> int:
        return 0 if self.pool_index is None else int(self.pool_index.numel())


def collate(examples: list[tuple[list[int], list[int]]], *, pack: bool, pack_length: int, pad_id: int) -> Batch:
    """`examples` are (input_ids, loss_mask) pairs. Labels are shifted here: label[t] = ids[t+1]."""
    rows: list[list[tuple[list[int], list[int]]]] = []
    if pack:
        cur, used = [], 0
        for ids, m in examples:
            if cur and used + len(ids) > pack_length:
                rows.append(cur)
                cur, used = [], 0
            cur.append((ids, m))
            used += len(ids)
        if cur:
            rows.append(cur)
        T = max(sum(len(i) for i, _ in r) for r in rows)
    else:
        rows = [[e] for e in examples]
        T = max(len(i) for i, _ in examples)
    B = len(rows)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    labels = torch.full((B, T), IGNORE, dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    seq_index = torch.full((B, T), -1, dtype=torch.long)
    pool: list[int] = []
    k = 0
    allowed = torch.zeros((B, T, T), dtype=torch.bool)
    causal = torch.ones((T, T), dtype=torch.bool).tril()
    n_tokens = 0
    for b, row in enumerate(rows):
        off = 0
        for ids, m in row:
            L = len(ids)
            input_ids[b, off:off + L] = torch.tensor(ids)
            tgt = torch.tensor(ids[1:] + [IGNORE])
            keep = torch.tensor(m[1:] + [0], dtype=torch.bool)  # the loss on token t+1 is predicted at t
            labels[b, off:off + L] = torch.where(keep, tgt, torch.full_like(tgt, IGNORE))
            pos[b, off:off + L] = torch.arange(L)
            seq_index[b, off:off + L] = k
            # A sequence is scored at its rightmost token that is not the pad id - the rule of transformers'
            # *ForSequenceClassification pooling, so a saved reward model scores as it was trained.
            real = [t for t, x in enumerate(ids) if x != pad_id]
            pool.append(b * T + off + (real[-1] if real else 0))
            k += 1
            allowed[b, off:off + L, off:off + L] = causal[:L, :L]
            off += L
            n_tokens += L
        if off < T:  # padding rows attend to themselves only, so softmax never sees an all-masked row
            idx = torch.arange(off, T)
            allowed[b, idx, idx] = True
    mask = torch.zeros((B, 1, T, T)).masked_fill(~allowed[:, None], float("-inf"))
    return Batch(input_ids=input_ids, labels=labels, position_ids=pos, attention_mask=mask,
                 num_loss_tokens=int((labels != IGNORE).sum()), num_tokens=n_tokens, seq_index=seq_index,
                 pool_index=torch.tensor(pool, dtype=torch.long))


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token cross-entropy, 0 where labels are IGNORE."""
    B, T, V = logits.shape
    return torch.nn.functional.cross_entropy(logits.float().reshape(B * T, V), labels.reshape(B * T),
                                             ignore_index=IGNORE, reduction="none").reshape(B, T)


def sequence_sums(values: torch.Tensor, labels: torch.Tensor, seq_index: torch.Tensor, n: int) -> torch.Tensor:
    """(n,) the sum of per-token `values` (B, T) over each sequence's loss tokens (labels != IGNORE)."""
    keep = labels != IGNORE
    return torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, seq_index[keep], values[keep])
