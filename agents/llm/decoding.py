"""The decode steps of a policy: one prompt pass that fills the KV cache (`begin`), a token
drawn from the kept logits (`sample`), and one cached step per appended token (`feed`).

`LLMPolicy` takes them as a mixin; they read only its `hf_model`, `_hidden`, `_heads`,
`_activate`, `pad_token_id`, `vocab_size`, `prefill_chunk_tokens` and `engine`. With an
`engine` (the fast path, `agents.llm.engine`) the three steps are the engine's. The one decode
loop over these steps is `agents.llm.rollout`.
"""

from __future__ import annotations

import torch

from . import speed
from .kvcache import growing_cache
from .sampling import DecodeState, SamplingConfig, Step, draw, first_seen
from .speed import trim_left_padding


class Decoding:
    """begin / sample / feed: incremental decoding with a KV cache (a mixin of LLMPolicy)."""

    engine = None  # a DecodeEngine: the fast path decodes instead (`agents.llm.engine`)

    def begin(self, prompt_ids, prompt_mask, sampling: SamplingConfig | None = None,
              max_new_tokens: int | None = None, repeat: int = 1) -> DecodeState:
        """Run the left-padded (B, P) prompt once; keep the KV cache and next-token logits.

        `max_new_tokens`, when known, sizes the KV cache exactly (no spare room to grow into).
        `repeat` G: each prompt row is decoded G times (rows kG..kG+G-1 of the state): one
        prompt pass, then the cache and the next-token state are repeated row by row.
        """
        if self.engine is not None:
            return self.engine.begin(prompt_ids, prompt_mask, sampling, max_new_tokens, repeat)
        sampling = sampling or SamplingConfig()
        with torch.inference_mode():
            self._activate()
            prompt_ids, prompt_mask = trim_left_padding(prompt_ids, prompt_mask)
            B, P = prompt_ids.shape
            cache = growing_cache(P + max_new_tokens if max_new_tokens else 0,
                                  dtype=speed.kv_cache_dtype(self))
            width = max(1, (self.prefill_chunk_tokens or B * P) // B)  # columns per chunk
            for start in range(0, P, width):  # the cache fills chunk by chunk: same keys/values
                end = min(P, start + width)
                h, cache = self._hidden(self.hf_model, prompt_ids[:, start:end],
                                        prompt_mask[:, :end], cache, use_cache=True)
            logits, value = self._heads(h[:, -1])
            return prompt_state(cache, prompt_ids, prompt_mask, logits, value, sampling,
                                self.vocab_size, repeat)

    def sample(self, state: DecodeState, generator: torch.Generator | None = None) -> Step:
        """Draw one token per row from the state's logits (no forward pass).

        `generator` must live on the model's device. Returned tensors are ordinary (not
        inference-mode) tensors, so they can be stored and used in PPO losses.
        """
        return draw(state.logits, state.value, state.seen, state.sampling, generator)

    def feed(self, state: DecodeState, token: torch.Tensor, active: torch.Tensor | None = None):
        """Append one token per row (inactive rows: pad, mask 0) and run one cached step."""
        if self.engine is not None:
            return self.engine.feed(state, token, active)
        with torch.inference_mode():
            self._activate()
            token, active, pos = append_token(state, token, active, self.pad_token_id)
            h, state.cache = self._hidden(self.hf_model, token[:, None], state.mask,
                                          cache=state.cache, position_ids=pos, use_cache=True)
            state.logits, state.value = self._heads(h[:, -1])
            mark_seen(state, token, active)
        return state


def prompt_state(cache, prompt_ids, prompt_mask, logits, value, sampling: SamplingConfig,
                 vocab_size: int, repeat: int = 1) -> DecodeState:
    """The decode state after a prompt pass: the prompt's tokens as seen (for a repetition
    penalty), and with `repeat` G every row, the cache's too, G times over."""
    seen = None
    if sampling.repetition_penalty != 1.0:
        seen = first_seen(prompt_ids, prompt_mask, 0, vocab_size) <= 0
    if repeat > 1:
        cache.batch_repeat_interleave(repeat)
        logits, value, prompt_mask = (x.repeat_interleave(repeat, 0)
                                      for x in (logits, value, prompt_mask))
        seen = None if seen is None else seen.repeat_interleave(repeat, 0)
    return DecodeState(cache, prompt_mask.long(), logits, value, seen, sampling)


def append_token(state: DecodeState, token: torch.Tensor, active: torch.Tensor | None,
                 pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Append one token per row to the state's mask (inactive rows: pad, mask 0); return the
    tokens to feed, the active rows and each row's position id (B, 1)."""
    active = torch.ones_like(token, dtype=torch.bool) if active is None else active.bool()
    token = torch.where(active, token, pad_token_id)
    state.mask = torch.cat([state.mask, active.long()[:, None]], dim=1)
    return token, active, (state.mask.sum(-1, keepdim=True) - 1).clamp(min=0)


def mark_seen(state: DecodeState, token: torch.Tensor, active: torch.Tensor) -> None:
    """Count the active rows' new tokens as seen (for a repetition penalty)."""
    if state.seen is not None:
        col = token[:, None]
        state.seen.scatter_(1, col, state.seen.gather(1, col) | active[:, None])
