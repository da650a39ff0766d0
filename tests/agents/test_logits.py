"""The blockwise log-prob path equals the plain one: log_softmax of the float32 logits, the
chosen token's entry, the entropy, and every gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agents.llm.logits import token_logprobs


def plain(h, w, b, tokens):
    """The computation the blockwise path replaces."""
    raw = F.log_softmax(F.linear(h, w, b).float(), dim=-1)
    return raw.gather(-1, tokens[..., None]).squeeze(-1), -(raw.exp() * raw).sum(-1)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [1, 3, 8, 64])
def test_values_and_gradients_equal_the_plain_computation(dtype, tol, rows):
    g = torch.Generator().manual_seed(0)
    n, hidden, vocab = 13, 16, 97  # rows that do not divide N
    h0 = torch.randn(2, n, hidden, generator=g)
    w0, b0 = torch.randn(vocab, hidden, generator=g) * 0.3, torch.randn(vocab, generator=g)
    tokens = torch.randint(0, vocab, (2, n), generator=g)
    up_lp, up_ent = torch.randn(2, n, generator=g), torch.randn(2, n, generator=g)
    grads = []
    for fn in (plain, lambda *a: token_logprobs(*a, rows=rows)):
        h, w, b = (x.clone().requires_grad_() for x in (h0, w0, b0))
        lp, ent = fn(h.to(dtype), w.to(dtype), b.to(dtype), tokens)
        ((lp * up_lp).sum() + (ent * up_ent).sum()).backward()
        grads.append((lp.detach(), ent.detach(), h.grad, w.grad, b.grad))
    for a, b_ in zip(*grads):
        assert a.dtype == b_.dtype and a.shape == b_.shape
        torch.testing.assert_close(a, b_, rtol=tol, atol=tol)


def test_without_an_entropy_gradient_only_the_log_probs_flow_back():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(5, 8, generator=g, requires_grad=True)
    w = torch.randn(31, 8, generator=g)
    tokens = torch.randint(0, 31, (5,), generator=g)
    lp, _ = token_logprobs(h, w, None, tokens)
    lp.sum().backward()
    ref = h.detach().clone().requires_grad_()
    plain(ref, w, None, tokens)[0].sum().backward()
    torch.testing.assert_close(h.grad, ref.grad)
    assert torch.all(lp <= 0)


def test_the_blockwise_kl_equals_the_exact_kl_and_is_zero_for_one_model():
    from agents.llm.logits import full_kl, kl_to_reference

    g = torch.Generator().manual_seed(2)
    own, ref = torch.randn(3, 5, 41, generator=g), torch.randn(3, 5, 41, generator=g)
    own[0, 0, :7] = -float("inf")  # tokens a top-k policy cannot draw: 0 log 0 = 0
    tokens = torch.randint(7, 41, (3, 5), generator=g)
    for rows in (1, 4, None):
        kl, ref_lp = kl_to_reference(own, ref, tokens, rows)
        lp, lq = F.log_softmax(own, -1), F.log_softmax(ref, -1)
        torch.testing.assert_close(kl, full_kl(lp, lq))
        torch.testing.assert_close(ref_lp, lq.gather(-1, tokens[..., None]).squeeze(-1))
    same = own.to(torch.bfloat16)
    assert torch.equal(kl_to_reference(same, same.clone(), tokens)[0], torch.zeros(3, 5))
