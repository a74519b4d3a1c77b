"""Sharding the data across ranks, and collating micro-batches (padded or packed).

Packing puts several examples in one row. Restarting position ids alone do NOT stop packed examples from
attending to each other in HF attention (measured: logits differ by ~0.4), so every batch carries a 4D
additive block-diagonal causal mask `(B, 1, T, T)` (0 = attend, -inf = blocked) together with the position
ids; padded batches use the same mask shape, so one code path serves both.

Objectives that score whole sequences (DPO's log-probs of a completion, a reward model's score) find each
sequence in a batch through `seq_index` (which sequence every position belongs to) and `pool_index` (where each
sequence's score is read), so they work on packed rows as well as padded ones - and on pairs laid out with a
shared prompt (`collate_units(share_prefix=True)`: prompt, chosen completion, rejected completion in one row,
each completion attending to the prompt and itself), where the prompt's positions belong to the first sequence
and carry no loss.
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
    num_tokens: int  # the sequences' tokens; a shared prompt counts once per sequence (the work it stands for)
    seq_index: torch.Tensor | None = None  # (B, T) which of the collated sequences a position holds, -1 = padding
    pool_index: torch.Tensor | None = None  # (N,) flat index into (B * T): each sequence's last non-pad token

    @property
    def num_sequences(self) -> int:
        return 0 if self.pool_index is None else int(self.pool_index.numel())


Sequence = tuple[list[int], list[int]]
"""(input ids, loss mask: 1 on the tokens that get loss)."""


@dataclass(frozen=True)
class _Piece:
    """A run of one sequence's tokens laid out contiguously in a row."""

    ids: list[int]
    labels: list[int]  # next-token targets, IGNORE where no loss
    first_position: int  # position id of the first token
    seq: int  # the sequence (collate order) it belongs to: for a shared prompt, the pair's first
    parent: int | None  # index in its unit of the piece it continues (sees all of it), or None
    pools: tuple[tuple[int, int], ...]  # (sequence, offset in this piece) of each sequence scored here


def shared_prefix_length(a: Sequence, b: Sequence) -> int:
    """How many leading tokens two sequences can share in one row: identical ids, no loss predicted at any of
    them (the last shared position predicts each branch's first token: no loss there either), and at least one
    token left to each branch."""
    (ia, ma), (ib, mb) = a, b
    n = 0
    while n < min(len(ia), len(ib)) - 1 and ia[n] == ib[n] and not (ma[n + 1] or mb[n + 1]):
        n += 1
    return n


def _labels(ids: list[int], mask: list[int]) -> list[int]:
    """label[t] = ids[t+1] where the loss mask is on at t+1 (the loss on token t+1 is predicted at t)."""
    return [ids[t + 1] if mask[t + 1] else IGNORE for t in range(len(ids) - 1)] + [IGNORE]


def _pool_offset(ids: list[int], pad_id: int) -> int:
    """A sequence is scored at its rightmost token that is not the pad id - the rule of transformers'
    *ForSequenceClassification pooling, so a saved reward model scores as it was trained."""
    real = [t for t, x in enumerate(ids) if x != pad_id]
    return real[-1] if real else 0


def _units(examples: list[tuple[Sequence, ...]], pad_id: int, share_prefix: bool) -> list[list[_Piece]]:
    """Each sequence its own unit; with share_prefix, a pair is ONE unit - the shared prompt, then each
    completion continuing it (positions as in its own sequence)."""
    units, k = [], 0
    for ex in examples:
        if share_prefix and len(ex) == 2:
            (a, b), s = ex, shared_prefix_length(*ex)
            pa, pb = _pool_offset(a[0], pad_id), _pool_offset(b[0], pad_id)
            la, lb = _labels(*a), _labels(*b)
            prefix = _Piece(a[0][:s], la[:s], 0, k, None, tuple((q, p) for q, p in ((k, pa), (k + 1, pb)) if p < s))
            units.append([prefix,
                          _Piece(a[0][s:], la[s:], s, k, 0, ((k, pa - s),) if pa >= s else ()),
                          _Piece(b[0][s:], lb[s:], s, k + 1, 0, ((k + 1, pb - s),) if pb >= s else ())])
            k += 2
            continue
        for ids, m in ex:
            units.append([_Piece(ids, _labels(ids, m), 0, k, None, ((k, _pool_offset(ids, pad_id)),))])
            k += 1
    return units


def collate(examples: list[Sequence], *, pack: bool, pack_length: int, pad_id: int) -> Batch:
    """`examples` are (input_ids, loss_mask) sequences. Labels are shifted here: label[t] = ids[t+1]."""
    return collate_units([(e,) for e in examples], pack=pack, pack_length=pack_length, pad_id=pad_id)


def collate_units(examples: list[tuple[Sequence, ...]], *, pack: bool, pack_length: int, pad_id: int,
                  share_prefix: bool = False) -> Batch:
    """`examples`: each a tuple of sequences (one for SFT, (chosen, rejected) for pairs), numbered in order.
    With `share_prefix` a pair goes into one row as prompt + chosen + rejected, the prompt once: each completion
    attends to the prompt and itself with the position ids of its own sequence, so every logit is the one its
    own row would give (float rounding aside) for ~(prompt / sequence) fewer tokens through the model. Packing
    fills rows up to `pack_length` tokens with whole units."""
    units = _units(examples, pad_id, share_prefix)
    length = [sum(len(p.ids) for p in u) for u in units]
    rows: list[list[int]] = []  # unit indices per row
    if pack:
        cur, used = [], 0
        for i, n in enumerate(length):
            if cur and used + n > pack_length:
                rows.append(cur)
                cur, used = [], 0
            cur.append(i)
            used += n
        if cur:
            rows.append(cur)
    else:
        rows = [[i] for i in range(len(units))]
    B, T = len(rows), max(sum(length[i] for i in r) for r in rows)
    n_seq = sum(len(ex) for ex in examples)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    labels = torch.full((B, T), IGNORE, dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    seq_index = torch.full((B, T), -1, dtype=torch.long)
    pool = [0] * n_seq
    allowed = torch.zeros((B, T, T), dtype=torch.bool)
    causal = torch.ones((T, T), dtype=torch.bool).tril()
    for b, row in enumerate(rows):
        off = 0
        for i in row:
            starts = []
            for p in units[i]:
                L = len(p.ids)
                starts.append(off)
                if L == 0:
                    continue
                input_ids[b, off:off + L] = torch.tensor(p.ids)
                labels[b, off:off + L] = torch.tensor(p.labels)
                pos[b, off:off + L] = torch.arange(p.first_position, p.first_position + L)
                seq_index[b, off:off + L] = p.seq
                for q, o in p.pools:
                    pool[q] = b * T + off + o
                allowed[b, off:off + L, off:off + L] = causal[:L, :L]
                if p.parent is not None:  # a continuation sees all of what it continues
                    parent = units[i][p.parent]
                    allowed[b, off:off + L, starts[p.parent]:starts[p.parent] + len(parent.ids)] = True
                off += L
        if off < T:  # padding rows attend to themselves only, so softmax never sees an all-masked row
            idx = torch.arange(off, T)
            allowed[b, idx, idx] = True
    mask = torch.zeros((B, 1, T, T)).masked_fill(~allowed[:, None], float("-inf"))
    return Batch(input_ids=input_ids, labels=labels, position_ids=pos, attention_mask=mask,
                 num_loss_tokens=int((labels != IGNORE).sum()),
                 num_tokens=sum(len(ids) for ex in examples for ids, _ in ex), seq_index=seq_index,
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
