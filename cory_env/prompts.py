"""Prompts as token rows: a task's template rendered with per-episode query and answer ids,
right-aligned into the observation window (`cory_env.core` has the layout), and the context
length a chain's prompts need.
"""

from __future__ import annotations

import numpy as np

from .tasks.base import QUERY, STATE, slot_position


def leading_ids(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before any text when asked to add its special
    tokens (BOS where it declares one; none for most): every prompt starts with them once."""
    probe = "a"
    full = tokenizer.encode(probe, add_special_tokens=True)
    plain = tokenizer.encode(probe, add_special_tokens=False)
    for i in range(len(full) - len(plain) + 1):
        if full[i:i + len(plain)] == plain:
            return list(full[:i])
    return []


class TemplateRenderer:
    """Turns a template plus per-episode query/response ids into right-aligned prompt rows.

    Pieces are static token ids, QUERY, STATE (the task's text for the turn) or the 0-based
    turn of an earlier answer.
    """

    def __init__(self, template, tokenizer, position: int = 1):
        self.lead = np.asarray(leading_ids(tokenizer), dtype=np.int64)
        self.pieces: list[str | int | np.ndarray] = []
        for piece in template.pieces():
            earlier = slot_position(piece, position)
            if piece in (QUERY, STATE):
                self.pieces.append(piece)
            elif earlier is not None:
                if not 1 <= earlier <= position:
                    raise ValueError(f"template {template.text!r} of chain position {position} "
                                     f"uses {piece}, but only answers 1..{position} come before")
                self.pieces.append(earlier - 1)
            else:
                ids = tokenizer.encode(piece, add_special_tokens=False)
                self.pieces.append(np.asarray(ids, dtype=np.int64))

    def static_len(self) -> int:
        """Tokens of the template's static text, the tokenizer's leading tokens included."""
        return len(self.lead) + sum(len(p) for p in self.pieces if isinstance(p, np.ndarray))

    def count(self, kind) -> int:
        """How many query pieces (kind=str) or earlier answers (kind=int) the template has."""
        if kind is str:
            return sum(isinstance(p, str) and p == QUERY for p in self.pieces)
        return sum(isinstance(p, kind) for p in self.pieces)

    @property
    def has_state(self) -> bool:
        """Whether the template holds the task's `{state}` text."""
        return any(isinstance(p, str) and p == STATE for p in self.pieces)

    def render(self, q_ids, q_len, answers, width: int, pad: int, state=None):
        """Return (ids (B,width), mask (B,width), dropped (B,)) with prompts right-aligned;
        `answers` holds the (ids (B, n), lengths (B,)) of the earlier turns and `state` those
        of the task's state text. The tokenizer's leading tokens (BOS where it declares one)
        start every prompt, also one cut on the left to fit."""
        m = len(self.lead)
        if state is not None:
            answers = [*answers, state]  # read by the STATE piece as the last part
        if not m:
            return self._render_body(q_ids, q_len, answers, width, pad)
        body, body_mask, dropped = self._render_body(q_ids, q_len, answers, width - m, pad)
        out = np.full((len(body), width), pad, dtype=np.int64)
        mask = np.zeros((len(body), width), dtype=np.int8)
        out[:, m:], mask[:, m:] = body, body_mask
        start = (width - m) - body_mask.sum(axis=1).astype(np.int64)  # first column of the lead
        cols = start[:, None] + np.arange(m)[None, :]
        rows = np.arange(len(body))[:, None]
        out[rows, cols], mask[rows, cols] = self.lead[None, :], 1
        return out, mask, dropped

    def _render_body(self, q_ids, q_len, answers, width: int, pad: int):
        """`render` without the leading tokens."""
        batch = len(q_len)
        if batch == 1:
            return self._render_one(q_ids[0, : q_len[0]],
                                    [ids[0, : n[0]] for ids, n in answers], width, pad)
        parts = []
        for piece in self.pieces:
            if isinstance(piece, str) and piece == STATE:
                parts.append(answers[-1])
            elif isinstance(piece, str):
                parts.append((q_ids, q_len))
            elif isinstance(piece, int):
                parts.append(answers[piece])
            else:
                parts.append((np.broadcast_to(piece, (batch, len(piece))),
                              np.full(batch, len(piece), dtype=np.int64)))
        total = sum(length for _, length in parts) if parts else np.zeros(batch, np.int64)
        total_max = int(total.max()) if batch else 0
        full = np.full((batch, max(total_max, 1)), pad, dtype=np.int64)
        offset = np.zeros(batch, dtype=np.int64)
        for ids, length in parts:
            valid = np.arange(ids.shape[1])[None, :] < length[:, None]
            r, c = np.nonzero(valid)
            full[r, offset[r] + c] = ids[r, c]
            offset += length
        # right-align: episode i's tokens are full[i, :total_i]; place them to end at `width`
        dropped = np.maximum(total - width, 0)
        keep = total - dropped
        out = np.full((batch, width), pad, dtype=np.int64)
        cols = np.arange(width)[None, :]
        start = (width - keep)[:, None]
        mask = cols >= start
        src = np.clip(cols - start + dropped[:, None], 0, full.shape[1] - 1)
        out[mask] = np.take_along_axis(full, src, axis=1)[mask]
        return out, mask.astype(np.int8), dropped

    def _render_one(self, query, answers, width: int, pad: int):
        """`render` for a single episode (the AEC env's path): one concatenate, no index maths."""
        parts = [answers[-1] if isinstance(piece, str) and piece == STATE
                 else query if isinstance(piece, str)
                 else answers[piece] if isinstance(piece, int) else piece
                 for piece in self.pieces]
        row = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        dropped = max(len(row) - width, 0)
        row = row[dropped:]
        out = np.full((1, width), pad, dtype=np.int64)
        mask = np.zeros((1, width), dtype=np.int8)
        if len(row):
            out[0, width - len(row):] = row
            mask[0, width - len(row):] = 1
        return out, mask, np.array([dropped], dtype=np.int64)


def chain_context(renderers, query_len: int, max_new_tokens: int) -> int:
    """The context length L that fits every position's longest prompt plus its answer:
    static tokens + `query_len` per query placeholder + max_new_tokens per earlier answer."""
    return max(r.static_len() + r.count(str) * query_len + r.count(int) * max_new_tokens
               for r in renderers) + max_new_tokens
