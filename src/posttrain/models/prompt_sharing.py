"""A group's responses scored with their prompt once: the teacher-forced layout of `head_logprobs` when rows
repeat a prompt (GRPO's n samples of a prompt, in the policy's update, its old log-probs and the reference's).

The padded layout (`generate.response_layout`) runs every row's prompt through the model: for 8 samples of a
205-token prompt with ~25-token answers, 8 x 230 tokens. Here each distinct prompt is ONE row - the prompt, then
each of its responses but the last token (the last is only a target) - under a 4D mask in which a response sees
the whole prompt and itself, causally, and never another response; position ids restart at the prompt's length
for every response. Every response token's hidden state is then the one its own padded row gives (float rounding
aside), for 205 + 8 x 25 tokens through the model. The prompt's last position predicts every response's first
token, so its hidden state is read once per response; its gradient sums over them, as over separate rows.

The padded layout's mask is a 2D attention mask; this one is the additive (rows, 1, T, T) float mask that SFT's
packed rows use (`sft.batching`), which HF's sdpa and eager attention take as given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SharedLayout:
    input_ids: torch.Tensor  # (G, T): a prompt and its responses a row (see below), pad_id after the last
    position_ids: torch.Tensor  # (G, T)
    attention_mask: torch.Tensor  # (G, 1, T, T) additive float: 0 = attend, -inf = blocked
    read: torch.Tensor  # (N,) flat index into (G * T): the position predicting each response token
    targets: torch.Tensor  # (N,) the response tokens, row by row (the order of `mask`'s True entries)
    mask: torch.Tensor  # (B, R) bool: which (row, response position) holds a token; R the longest response


def shared_prompt_layout(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int
                         ) -> SharedLayout | None:
    """The layout described in the module docstring, for rows (prompt_ids[i], response_ids[i]). A prompt's row
    takes responses while it stays within twice the longest padded row (its prompt plus the longest response),
    then the prompt opens another row: attention over one row costs its length squared and its mask holds that
    many entries, so long responses share a prompt in twos or threes or not at all (a row per response) - long
    prompts with short answers, where sharing pays, share it whole. None when no row would hold two responses
    (nothing to share): the caller keeps the padded layout, and no mask is built."""
    if any(not p for p in prompt_ids):
        raise ValueError("shared_prompt_layout: every row needs a prompt token (the one predicting its first "
                         "response token)")
    B, R = len(prompt_ids), max(max((len(r) for r in response_ids), default=0), 1)
    tokens: list[list[int]] = []  # per layout row: the prompt, then its responses' inputs
    positions: list[list[int]] = []
    spans: list[list[tuple[int, int]]] = []  # per layout row: (start, end) of the prompt, then of each response
    open_row: dict[tuple[int, ...], int] = {}  # prompt -> the row taking its responses
    reads: list[tuple[int, int]] = []  # (row, column) predicting each response token, row-major
    for p, r in zip(prompt_ids, response_ids):
        L, key = len(p), tuple(p)
        g = open_row.get(key)
        if g is None or (len(spans[g]) > 1 and len(tokens[g]) + len(r) - 1 > 2 * (L + R)):
            g = open_row[key] = len(tokens)
            tokens.append(list(p))
            positions.append(list(range(L)))
            spans.append([(0, L)])
        start = len(tokens[g])
        reads.extend((g, L - 1 if j == 0 else start + j - 1) for j in range(len(r)))
        tokens[g].extend(r[:-1])
        positions[g].extend(range(L, L + max(len(r) - 1, 0)))
        spans[g].append((start, len(tokens[g])))
    G, T = len(tokens), max(len(t) for t in tokens)
    if G == B:
        return None
    ids = torch.full((G, T), pad_id, dtype=torch.long)
    pos = torch.zeros((G, T), dtype=torch.long)
    allowed = torch.zeros((G, T, T), dtype=torch.bool)
    causal = torch.ones((T, T), dtype=torch.bool).tril()
    for g in range(G):
        n, L = len(tokens[g]), spans[g][0][1]
        ids[g, :n] = torch.tensor(tokens[g])
        pos[g, :n] = torch.tensor(positions[g])
        allowed[g, :L, :L] = causal[:L, :L]
        for s, e in spans[g][1:]:
            allowed[g, s:e, :L] = True  # a response sees the whole prompt ...
            allowed[g, s:e, s:e] = causal[:e - s, :e - s]  # ... and itself, causally
        idx = torch.arange(n, T)  # padding attends to itself only: no softmax over an all-masked row
        allowed[g, idx, idx] = True
    mask = torch.zeros((B, R), dtype=torch.bool)
    for i, r in enumerate(response_ids):
        mask[i, :len(r)] = True
    return SharedLayout(
        input_ids=ids, position_ids=pos,
        attention_mask=torch.zeros((G, 1, T, T)).masked_fill(~allowed[:, None], float("-inf")),
        read=torch.tensor([g * T + c for g, c in reads], dtype=torch.long),
        targets=torch.tensor([t for r in response_ids for t in r], dtype=torch.long), mask=mask)
