"""Sampling: how the next token is drawn, and the same transform for the training pass.

`SamplingConfig` holds the knobs (paper: top_k 0, top_p 1; the IMDB code: repetition penalty
1.1). `transform_logits` applies them in one fixed order, both when a token is drawn and when
PPO recomputes its log-prob, so the ratio is taken under the distribution actually sampled.

Repetition penalty follows the usual rule (seen logit < 0: times penalty, else divided by it),
but "seen" means attended context tokens only (prompt tokens with mask 1 and earlier response
tokens), not left padding. A token sampled just outside a top-k/top-p set in the recomputation
(float noise at the boundary) gets log-prob -inf; the paper trains with top_k=0, top_p=1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cory_common.checks import check_fields, check_int, meta


@dataclass
class SamplingConfig:
    """How next tokens are drawn (paper: top_k 0, top_p 1; IMDB code: repetition_penalty 1.1)."""

    temperature: float = field(default=1.0, metadata=meta("sampling temperature"))
    top_k: int = field(default=0, metadata=meta("keep the k likeliest tokens (0: all)"))
    top_p: float = field(default=1.0, metadata=meta("nucleus sampling mass"))
    repetition_penalty: float = field(default=1.0, metadata=meta("sampling repetition penalty"))

    def __post_init__(self):
        self.validate()

    def validate(self) -> SamplingConfig:
        """Raise ValueError naming the bad field."""
        check_fields(self)
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        check_int("top_k", self.top_k, 0)
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        return self

    @property
    def is_identity(self) -> bool:
        """True when sampling is plain softmax sampling from the policy."""
        return (self.temperature == 1.0 and self.top_k == 0 and self.top_p == 1.0
                and self.repetition_penalty == 1.0)




@dataclass
class Step:
    """One sampled token per row, with its log-probs, the state value and the raw log-softmax."""

    token: torch.Tensor  # (B,) long
    logprob: torch.Tensor  # (B,) under the distribution actually sampled from
    raw_logprob: torch.Tensor  # (B,) under the untransformed policy
    value: torch.Tensor  # (B,)
    logsoftmax: torch.Tensor  # (B, V) raw policy log-softmax


@dataclass
class DecodeState:
    """Incremental decoding state: KV cache, mask so far, next-token logits/value, seen tokens."""

    cache: object
    mask: torch.Tensor  # (B, L) attention mask of everything in the cache
    logits: torch.Tensor  # (B, V) float32 logits for the next token
    value: torch.Tensor  # (B,) value of the current state
    seen: torch.Tensor | None  # (B, V) bool attended context tokens (repetition penalty only)
    sampling: SamplingConfig


def first_seen(ids: torch.Tensor, mask: torch.Tensor, n_response: int, vocab: int) -> torch.Tensor:
    """(B, V) first response step that has token v in its context (T + 1 if never).

    Prompt tokens count as seen from step 0; response token j is in the context of steps > j.
    Masked tokens never count. Then "v is seen at step t" is simply `first[:, v] <= t`.
    """
    B, L = ids.shape
    P = L - n_response
    idx = torch.where(mask.bool(), ids, vocab)  # masked tokens go to a dump column
    src = torch.arange(L, device=ids.device) - P + 1  # prompt -> <= 0, response j -> j + 1
    src = src.clamp(min=0).expand(B, L)
    first = torch.full((B, vocab + 1), n_response + 1, dtype=torch.long, device=ids.device)
    first.scatter_reduce_(1, idx, src, reduce="amin")
    return first[:, :vocab]


def transform_logits(logits: torch.Tensor, seen: torch.Tensor | None, s: SamplingConfig):
    """Apply repetition penalty, temperature, top-k and top-p (in that order) over the last dim."""
    if s.repetition_penalty != 1.0 and seen is not None:
        p = s.repetition_penalty
        with torch.no_grad():  # a piecewise-constant factor: one multiply, cheap backward
            factor = torch.where(logits < 0, p, 1.0 / p).masked_fill_(~seen, 1.0)
        logits = logits * factor
    if s.temperature != 1.0:
        logits = logits / s.temperature
    if 0 < s.top_k < logits.shape[-1]:
        kth = logits.topk(s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = (probs.cumsum(-1) - probs) >= s.top_p  # mass strictly above the token >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


BLOCK = 256  # vocabulary entries per block of the two-level inverse CDF
SAMPLER = "two-level inverse CDF"  # named in every benchmark record's `draws`


def sample_from_logprobs(logp: torch.Tensor, generator: torch.Generator | None = None):
    """Inverse-CDF sampling of one index per row of (B, V) log-probs, in two levels: the block
    of BLOCK entries (the blocks' sums run in float64), then the entry within it (a float64
    running sum over that block).

    One float32 running sum over the whole vocabulary strays from the distribution (about 2e-3
    in total variation over Gemma 3's 262k entries; this, about 4e-8: tools/perf/draws.py) and
    is a sequential pass over all of it. Zero-probability entries can never be drawn: the first
    index whose CDF exceeds u is returned.
    """
    B, V = logp.shape
    p = logp.exp()
    blocks = (F.pad(p, (0, -V % BLOCK)) if V % BLOCK else p).view(B, -1, BLOCK)
    ends = blocks.sum(-1).double().cumsum(-1)  # (B, blocks)
    where = generator.device if generator is not None else p.device  # a CPU generator works too
    u = torch.rand(B, 1, generator=generator, device=where, dtype=p.dtype).to(p.device)
    target = u.double() * ends[:, -1:]
    block = torch.searchsorted(ends, target, right=True).clamp(max=ends.shape[1] - 1)
    before = torch.where(block > 0, ends.gather(1, (block - 1).clamp(min=0)), 0.0)
    inner = blocks.gather(1, block[:, :, None].expand(B, 1, BLOCK)).squeeze(1).double()
    entry = torch.searchsorted(inner.cumsum(-1), target - before, right=True)
    # rounding between the two levels never takes a draw past the block's last drawable entry
    last = torch.where(inner > 0, torch.arange(BLOCK, device=p.device), -1).amax(-1, True)
    return (block * BLOCK + torch.minimum(entry, last)).squeeze(-1)


# cuDNN's fused attention returns NaN gradients in bf16 when a query row is all padding (the


@torch.no_grad()
def draw(logits: torch.Tensor, value: torch.Tensor, seen: torch.Tensor | None,
         sampling: SamplingConfig, generator: torch.Generator | None = None) -> Step:
    """Sample one token per row of (B, V) next-token logits under `sampling`."""
    raw = F.log_softmax(logits, dim=-1)
    if sampling.is_identity:
        logp = raw
    else:
        logp = F.log_softmax(transform_logits(logits, seen, sampling), -1)
    token = sample_from_logprobs(logp, generator)[:, None]
    return Step(token=token.squeeze(-1), logprob=logp.gather(-1, token).squeeze(-1),
                raw_logprob=raw.gather(-1, token).squeeze(-1), value=value.clone(),
                logsoftmax=raw)
