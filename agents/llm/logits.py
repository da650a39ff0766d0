"""The chosen tokens' log-probabilities and the entropy from the LM head, without holding the
full-vocabulary float32 logits.

    lp, entropy = token_logprobs(h, weight, bias, tokens)   # h (N, H); both (N,), with grad
    kl, ref_lp = kl_to_reference(logits, ref_logits, tokens)  # no grad: the rollout's KL
    z = head_output(hf, h, amp_dtype, cache)                # a model's LM head, its dtype

The head's matmul runs once, in its own dtype (bf16 under the study's autocast); everything
after it (the float32 cast, log-sum-exp, the gather, the entropy) runs on blocks of positions
whose float32 copy fits in a core's cache (BLOCK_BYTES), instead of as whole (N, V) passes. The
backward keeps only the matmul's output and recomputes each block's softmax from it:

    d log p(x) / d z = onehot(x) − p          d H / d z = −p (log p + H)

so the gradient that reaches the head's input equals the plain computation's (log_softmax,
gather, entropy of the float32 logits) to float rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BLOCK_BYTES = 2 << 20  # float32 logits per block: 10 rows of SmolLM2's 49,152, 2 of Gemma's 262,144


def _block_stats(z: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(log p(token), entropy, log-sum-exp) of one block of logits (any dtype), in float32."""
    zf = z.float()
    lse = torch.logsumexp(zf, dim=-1)
    chosen = zf.gather(-1, tokens[:, None]).squeeze(-1) - lse
    p = torch.exp(zf - lse[:, None])
    entropy = lse - (p * zf).sum(-1)
    return chosen, entropy, lse


class TokenLogprobs(torch.autograd.Function):
    """log p(token) and the entropy at each row from the head's logits, blockwise; the logits
    themselves (the matmul's output, not differentiable) as a third output."""

    @staticmethod
    def forward(ctx, h, weight, bias, tokens, rows):
        z = F.linear(h, weight, bias)  # (N, V) in the matmul's dtype, kept for the backward
        ctx.mark_non_differentiable(z)
        chosen, entropy, lse = (torch.empty(len(h), device=h.device) for _ in range(3))
        for i in range(0, len(h), rows):
            chosen[i:i + rows], entropy[i:i + rows], lse[i:i + rows] = _block_stats(
                z[i:i + rows], tokens[i:i + rows])
        ctx.save_for_backward(h, weight, tokens, z, lse, entropy)
        ctx.rows, ctx.has_bias = rows, bias is not None
        return chosen, entropy, z

    @staticmethod
    def backward(ctx, g_chosen, g_entropy, _):
        h, weight, tokens, z, lse, entropy = ctx.saved_tensors
        gz = torch.empty_like(z)
        for i in range(0, len(h), ctx.rows):
            s = slice(i, i + ctx.rows)
            logp = z[s].float() - lse[s, None]
            p = logp.exp()
            g = p * -g_chosen[s, None]
            g.scatter_add_(-1, tokens[s, None], g_chosen[s, None])
            if g_entropy is not None:
                g -= g_entropy[s, None] * p * (logp + entropy[s, None])
            gz[s] = g
        grad_h = gz @ weight if ctx.needs_input_grad[0] else None
        grad_w = gz.t() @ h if ctx.needs_input_grad[1] else None
        grad_b = gz.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_h, grad_w, grad_b, None, None


def _rows(vocab: int) -> int:
    """Positions per block: BLOCK_BYTES of float32 logits."""
    return max(1, BLOCK_BYTES // (4 * vocab))


def token_logprobs(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   tokens: torch.Tensor, rows: int | None = None, logits: bool = False):
    """log p(tokens) and the entropy (float32, shape h.shape[:-1]) of the head on h, and with
    `logits` the head's output too (h.shape[:-1] + (V,), the matmul's dtype); h and weight in
    the matmul's dtype; `rows` per block (default: BLOCK_BYTES of float32)."""
    shape = h.shape[:-1]
    lp, ent, z = TokenLogprobs.apply(h.reshape(-1, h.shape[-1]), weight, bias,
                                     tokens.reshape(-1), rows or _rows(weight.shape[0]))
    out = (lp.reshape(shape), ent.reshape(shape))
    return (*out, z.reshape(*shape, -1)) if logits else out


def full_kl(logsoftmax: torch.Tensor, ref_logsoftmax: torch.Tensor) -> torch.Tensor:
    """Exact KL(p || q) = sum_v p (log p - log q) over the last (vocab) dim; >= 0."""
    p = logsoftmax.exp()
    diff = torch.where(p > 0, logsoftmax - ref_logsoftmax, torch.zeros_like(p))  # 0 log 0 = 0
    return (p * diff).sum(-1).clamp_min(0.0)


@torch.no_grad()
def kl_to_reference(own: torch.Tensor, ref: torch.Tensor, tokens: torch.Tensor,
                    rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact KL(p || q) = Σ_v p (log p − log q) and log q(token) at each position, from the two
    models' logits (or log-probabilities) of shape (..., V), blockwise; both float32 (...)."""
    shape, vocab = own.shape[:-1], own.shape[-1]
    a, b = own.reshape(-1, vocab), ref.reshape(-1, vocab)
    t = tokens.reshape(-1, 1)
    kl = torch.empty(len(a), device=own.device)
    ref_lp = torch.empty(len(a), device=own.device)
    rows = rows or _rows(vocab)
    for i in range(0, len(a), rows):
        lp = F.log_softmax(a[i:i + rows].float(), dim=-1)
        lq = F.log_softmax(b[i:i + rows].float(), dim=-1)
        kl[i:i + rows] = full_kl(lp, lq)
        ref_lp[i:i + rows] = lq.gather(-1, t[i:i + rows]).squeeze(-1)
    return kl.reshape(shape), ref_lp.reshape(shape)


def head_operands(hf: nn.Module, h: torch.Tensor, dtype: torch.dtype | None, cache: dict):
    """(input, weight, bias) of `hf`'s LM head in the dtype its matmul runs in: `dtype` under
    autocast, where a frozen float32 head (tied to the embeddings) uses a bf16 copy of its
    weight kept in `cache` (the numbers autocast would cast it to on every call, cast once:
    28M weights a call for SmolLM2)."""
    head = hf.get_output_embeddings()
    w, b = head.weight, head.bias
    if dtype is None:
        return h, w, b
    if dtype != torch.bfloat16 or w.requires_grad or w.dtype != torch.float32:
        return h.to(dtype), w.to(dtype), None if b is None else b.to(dtype)
    hit = cache.get(id(w))
    if hit is None or hit[0] is not w or hit[1] != w._version:
        with torch.inference_mode(False), torch.no_grad():  # usable by passes with grad
            bias = None if b is None else b.to(torch.bfloat16)
            hit = cache[id(w)] = (w, w._version, w.to(torch.bfloat16), bias)
    return h.to(torch.bfloat16), hit[2], hit[3]


def head_output(hf: nn.Module, h: torch.Tensor, dtype: torch.dtype | None,
                cache: dict) -> torch.Tensor:
    """`hf`'s LM head on h in the matmul's dtype (float32 once soft-capped)."""
    z = F.linear(*head_operands(hf, h, dtype, cache))
    cap = getattr(hf.config, "final_logit_softcapping", None)
    return torch.tanh(z.float() / cap) * cap if cap else z


def fused_head(hf: nn.Module) -> bool:
    """Whether `token_logprobs` computes this head: a plain linear head, not soft-capped."""
    return (isinstance(hf.get_output_embeddings(), nn.Linear)
            and not getattr(hf.config, "final_logit_softcapping", None))
