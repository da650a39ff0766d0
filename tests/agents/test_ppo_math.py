"""Tests of the token-level PPO core (agents/learners/ppo.py) against hand-computed numbers."""

import copy
import dataclasses
import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from agents.learners.learner import LearnerConfig
from agents.learners.ppo import (
    PPOBatch,
    forward_passes,
    gae,
    kl_loss_term,
    kl_per_token,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_loss,
    ppo_update,
    prepare_advantages,
    value_loss,
)
from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.learners.shaping import (
    AdaptiveKLController,
    FixedKLController,
    RunningMoments,
    make_kl_controller,
    scale_scores,
    token_rewards,
)
from agents.llm.logits import full_kl
from benchmarks.settings.presets import GSM8K_BATCH, IMDB_BATCH
from benchmarks.settings.presets import IMDB_PPO as IMDB_PRESET
from benchmarks.settings.presets import gsm8k_ppo as gsm8k_preset

NAN = float("nan")


def close(actual, expected, atol=1e-6):
    """Elementwise closeness of a tensor to a nested list."""
    expected = torch.tensor(expected, dtype=torch.float64)
    assert torch.allclose(actual.double(), expected, atol=atol), (actual, expected)


# --------------------------------------------------------------------------- GAE
def test_gae_hand_computed_gamma1_lam095_with_masked_row():
    # Row 0, full length.  delta2 = 1.0 - 0.3 = 0.7; delta1 = -0.2 + 0.3 - 0.4 = -0.3;
    # delta0 = 0.1 + 0.4 - 0.5 = 0.0.  A2 = 0.7; A1 = -0.3 + 0.95*0.7 = 0.365;
    # A0 = 0 + 0.95*0.365 = 0.34675.  R = A + V = [0.84675, 0.765, 1.0].
    # Row 1, length 2 (position 2 is garbage and must be ignored; V_2 counts as 0).
    # delta1 = 0.8 + 0 - 0.4 = 0.4; delta0 = 0.1 + 0.4 - 0.5 = 0.0.
    # A1 = 0.4; A0 = 0.95*0.4 = 0.38.  R = [0.88, 0.8, 0].
    rewards = torch.tensor([[0.1, -0.2, 1.0], [0.1, 0.8, 5.0]])
    values = torch.tensor([[0.5, 0.4, 0.3], [0.5, 0.4, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    close(adv, [[0.34675, 0.365, 0.7], [0.38, 0.4, 0.0]])
    close(ret, [[0.84675, 0.765, 1.0], [0.88, 0.8, 0.0]])


def test_gae_hand_computed_discounted():
    # gamma=0.9, lam=0.5, r=[0,0,1], V=[0.2,0.1,0].
    # delta2 = 1; delta1 = 0 + 0.9*0 - 0.1 = -0.1; delta0 = 0 + 0.9*0.1 - 0.2 = -0.11.
    # A2 = 1; A1 = -0.1 + 0.45*1 = 0.35; A0 = -0.11 + 0.45*0.35 = 0.0475.
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.2, 0.1, 0.0]])
    adv, ret = gae(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.5)
    close(adv, [[0.0475, 0.35, 1.0]])
    close(ret, [[0.2475, 0.45, 1.0]])


def test_prepare_advantages_whitens_over_mask():
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    b = PPOBatch(
        input_ids=torch.zeros(3, 6, dtype=torch.long), attention_mask=torch.ones(3, 6),
        response_mask=mask, old_logprobs=torch.zeros(3, 4),
        old_values=torch.randn(3, 4, generator=g),
        ref_logprobs=torch.zeros(3, 4), rewards=torch.randn(3, 4, generator=g),
    )
    prepare_advantages(b, PPOConfig(mini_batch_size=3))
    assert abs(masked_mean(b.advantages, mask).item()) < 1e-6
    assert abs(masked_var(b.advantages, mask).item() - 1.0) < 1e-4
    assert (b.advantages[mask == 0] == 0).all()
    raw, ret = gae(b.rewards, b.old_values, mask, 1.0, 0.95)
    close(b.returns, ret.tolist())


# --------------------------------------------------------------------------- masked stats
def test_masked_stats():
    x = torch.tensor([[1.0, 2.0, NAN], [3.0, 6.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    assert masked_mean(x, mask).item() == pytest.approx(3.0)
    close(masked_mean(x, mask, dim=1), [1.5, 4.5])
    assert masked_var(x, mask).item() == pytest.approx(np.var([1, 2, 3, 6], ddof=1))
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(np.var([1, 2, 3, 6]))
    w = masked_whiten(x, mask)
    assert masked_mean(w, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(w, mask).item() == pytest.approx(1.0, abs=1e-5)
    assert torch.isfinite(w).all()
    assert masked_mean(masked_whiten(x, mask, shift_mean=False), mask).item() == pytest.approx(3.0)
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0


# --------------------------------------------------------------------------- rewards
def test_token_rewards_score_on_last_valid_token_and_empty_row():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [1.0, NAN, 5.0], [7.0, 7.0, 7.0], [0.5, -0.5, 9.0]])
    scores = torch.tensor([10.0, 20.0, 30.0, 40.0])
    r = token_rewards(scores, kl, mask, kl_coef=0.5)
    close(r, [[-0.05, -0.1, 10.0 - 0.15], [20.0 - 0.5, 0.0, 0.0], [0.0, 0.0, 0.0],
              [-0.25, 40.0 + 0.25, 0.0]])


# --------------------------------------------------------------------------- KL
def test_kl_modes_hand_values():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    close(kl_per_token(logp, ref, "kl"), [[0.5, -1.0]])
    close(kl_per_token(logp, ref, "abs"), [[0.5, 1.0]])
    close(kl_per_token(logp, ref, "mse"), [[0.125, 0.5]])
    # p = [1/2, 1/2], q = [1/4, 3/4]: KL = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3) = 0.1438410362
    lsm = torch.tensor([0.5, 0.5]).log().view(1, 1, 2)
    rlsm = torch.tensor([0.25, 0.75]).log().view(1, 1, 2)
    close(kl_per_token(logp[:, :1], ref[:, :1], "full", lsm, rlsm), [[0.1438410362]])
    with pytest.raises(ValueError, match="full"):
        kl_per_token(logp, ref, "full")
    with pytest.raises(ValueError, match="bogus"):
        kl_per_token(logp, ref, "bogus")


def test_full_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(1)
    lsm = torch.log_softmax(torch.randn(3, 5, 11, generator=g) * 3, -1)
    rlsm = torch.log_softmax(torch.randn(3, 5, 11, generator=g) * 3, -1)
    expected = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=lsm), torch.distributions.Categorical(logits=rlsm))
    got = full_kl(lsm, rlsm)
    assert got.shape == (3, 5)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(full_kl(lsm, lsm), torch.zeros(3, 5))
    # zero-probability tokens (e.g. after top-k) contribute 0, not NaN
    p = torch.tensor([[[0.5, 0.5, 0.0]]]).log()
    q = torch.tensor([[[0.25, 0.5, 0.25]]]).log()
    close(full_kl(p, q), [[0.5 * math.log(2.0)]])


def test_kl_loss_estimators_hand_values():
    # token 0: d = ref - logp = -0.5; token 1: d = 1.0; token 2 masked (garbage).
    # k1 = -d = [0.5, -1]; k2 = d^2/2 = [0.125, 0.5]; k3 = e^d - d - 1 = [0.1065306597, e - 2].
    logp = torch.tensor([[-1.0, -2.0, NAN]])
    ref = torch.tensor([[-1.5, -1.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert kl_loss_term(logp, ref, mask, "k1").item() == pytest.approx(-0.25)
    assert kl_loss_term(logp, ref, mask, "k2").item() == pytest.approx(0.3125)
    k3 = (0.1065306597 + (math.e - 2.0)) / 2
    assert kl_loss_term(logp, ref, mask, "k3").item() == pytest.approx(k3, abs=1e-6)
    with pytest.raises(ValueError, match="k4"):
        kl_loss_term(logp, ref, mask, "k4")
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    kl_loss_term(logp, ref[:, :2], mask[:, :2], "k3").backward()
    # d k3 / d logp = 1 - exp(d), averaged over 2 tokens
    close(logp.grad, [[(1 - math.exp(-0.5)) / 2, (1 - math.e) / 2]])


# --------------------------------------------------------------------------- losses
def test_policy_loss_clipped_and_unclipped_regimes():
    # eps = 0.2.  (ratio, A) -> max(-A r, -A clip(r)):
    # (1.5, 1) -> max(-1.5, -1.2) = -1.2 clipped;  (1.5, -1) -> max(1.5, 1.2) = 1.5;
    # (0.5, 1) -> max(-0.5, -0.8) = -0.5;          (0.5, -2) -> max(1.0, 1.6) = 1.6 clipped;
    # (1.1, 2) -> -2.2 (inside the range).  mean = -0.8 / 5 = -0.16; clipfrac = 2/5.
    ratios = [1.5, 1.5, 0.5, 0.5, 1.1]
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0, 7.0]])
    logp = old.clone()
    logp[0, :5] += torch.tensor(ratios).log()
    logp[0, 5] = NAN  # masked garbage
    adv = torch.tensor([[1.0, -1.0, 1.0, -2.0, 2.0, NAN]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, stats = policy_loss(logp, old, adv, mask, cliprange=0.2)
    assert loss.item() == pytest.approx(-0.16, abs=1e-6)
    assert stats["clipfrac"].item() == pytest.approx(0.4)
    assert stats["ratio_mean"].item() == pytest.approx(1.02, abs=1e-6)
    approx_kl = 0.5 * sum(math.log(r) ** 2 for r in ratios) / 5
    assert stats["approx_kl"].item() == pytest.approx(approx_kl, abs=1e-6)
    # unclipped regime: loss = -mean(A * ratio) = -(1*1.1 + -1*0.9) / 2 = -0.1
    logp2 = torch.tensor([[math.log(1.1), math.log(0.9)]], requires_grad=True)
    loss2, stats2 = policy_loss(logp2, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]),
                                torch.ones(1, 2), cliprange=0.2)
    assert loss2.item() == pytest.approx(-0.1, abs=1e-6)
    assert stats2["clipfrac"].item() == 0.0
    loss2.backward()
    close(logp2.grad, [[-1.1 / 2, 0.9 / 2]])  # d(-A r)/dlogp = -A r / n


def test_value_loss_clipped_and_unclipped_regimes():
    # eps_v = 0.2, V_old = 0.
    # V=0.5, R=1: V_clip=0.2, max(0.25, 0.64) = 0.64 (clipped)
    # V=0.5, R=0: max(0.25, 0.04) = 0.25;  V=0.1, R=1: V_clip=0.1, 0.81.
    # loss = 0.5 * (0.64 + 0.25 + 0.81) / 3 = 0.283333; value_clipfrac = 1/3
    values = torch.tensor([[0.5, 0.5, 0.1, NAN]])
    old = torch.tensor([[0.0, 0.0, 0.0, 4.0]])
    ret = torch.tensor([[1.0, 0.0, 1.0, NAN]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, stats = value_loss(values, old, ret, mask, cliprange_value=0.2)
    assert loss.item() == pytest.approx(1.7 / 6, abs=1e-6)
    assert stats["value_clipfrac"].item() == pytest.approx(1 / 3)
    # unclipped: V=0.1, R=0.5 -> 0.5 * 0.16 = 0.08
    loss2, stats2 = value_loss(torch.tensor([[0.1]]), torch.zeros(1, 1), torch.tensor([[0.5]]),
                               torch.ones(1, 1), 0.2)
    assert loss2.item() == pytest.approx(0.08, abs=1e-6)
    assert stats2["value_clipfrac"].item() == 0.0


# --------------------------------------------------------------------------- controllers
def test_adaptive_kl_controller_formula_and_state():
    ctl = AdaptiveKLController(0.3, target=6.0, horizon=10000)
    ctl.update(9.0, n_steps=256)  # error = clip(0.5) = 0.2
    assert ctl.coef == pytest.approx(0.3 * (1 + 0.2 * 256 / 10000))
    ctl.update(5.4, n_steps=256)  # error = -0.1
    assert ctl.coef == pytest.approx(0.3 * 1.00512 * (1 - 0.1 * 256 / 10000))
    ctl.update(0.0, n_steps=100)  # error clipped to -0.2
    expected = 0.3 * 1.00512 * 0.99744 * (1 - 0.2 * 100 / 10000)
    assert ctl.coef == pytest.approx(expected)
    other = AdaptiveKLController(1.0, 1.0, 1.0)
    other.load_state_dict(ctl.state_dict())
    assert other.state_dict() == ctl.state_dict()
    fixed = FixedKLController(0.01)
    assert fixed.update(100.0, 32) == 0.01
    fixed2 = FixedKLController(5.0)
    fixed2.load_state_dict(fixed.state_dict())
    assert fixed2.coef == 0.01
    with pytest.raises(KeyError, match="kl_coef"):  # an earlier version's "value" is not read
        fixed2.load_state_dict({"value": 0.5})
    assert isinstance(make_kl_controller(IMDB_PRESET, 256), AdaptiveKLController)
    assert isinstance(make_kl_controller(gsm8k_preset("cory"), 32), FixedKLController)


# --------------------------------------------------------------------------- scores
def test_running_moments_match_numpy_over_concatenated_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=n) for n in (5, 3, 7, 1, 4)]
    rm = RunningMoments()
    seen = []
    for b in batches:
        bm, bs = rm.update(torch.tensor(b, dtype=torch.float32))
        seen.append(b.astype(np.float32).astype(np.float64))
        allx = np.concatenate(seen)
        assert bm == pytest.approx(float(np.float32(b).mean()), abs=1e-5)
        if len(b) > 1:
            assert bs == pytest.approx(float(np.float32(b).std(ddof=1)), abs=1e-5)
        assert rm.mean == pytest.approx(allx.mean(), abs=1e-9)
        assert rm.std == pytest.approx(allx.std(ddof=1), abs=1e-9)
    rm2 = RunningMoments()
    rm2.load_state_dict(rm.state_dict())
    assert (rm2.mean, rm2.std, rm2.count) == (rm.mean, rm.std, rm.count)


def test_scale_scores_scaling_norm_and_clip():
    s = torch.tensor([1.0, 2.0, 3.0, 6.0])
    std, mean = float(np.std([1, 2, 3, 6], ddof=1)), 3.0
    out = scale_scores(s, RunningMoments(), PPOConfig(use_score_scaling=True))
    close(out, (s / std).tolist(), atol=1e-5)
    cfg = PPOConfig(use_score_scaling=True, use_score_norm=True)
    close(scale_scores(s, RunningMoments(), cfg), ((s - mean) / std).tolist(), atol=1e-5)
    clipped = scale_scores(s, RunningMoments(), PPOConfig(score_clip=2.5))
    close(clipped, [1.0, 2.0, 2.5, 2.5])
    rm = RunningMoments()
    close(scale_scores(s, rm, PPOConfig()), s.tolist())
    assert rm.count == 0  # scaling off: moments untouched


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize("field,value", [
    ("lr", -1e-5), ("lr", NAN), ("ppo_epochs", 0), ("mini_batch_size", 0), ("mini_batch_size", 2.5),
    ("cliprange", 0.0), ("vf_coef", -0.1), ("gamma", 1.5), ("lam", -0.1),
    ("score_clip", 0.0), ("max_grad_norm", -1.0),
    ("early_stop_kl", -0.5), ("ratio_threshold", 0.0), ("entropy_coef", -0.01),
    ("max_tokens_per_pass", 0), ("max_tokens_per_pass", 64.0), ("old_logprobs", "decode"),
])
def test_config_validate_names_the_field(field, value):
    cfg = PPOConfig()
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=f"PPOConfig.{field} "):
        cfg.validate()
    with pytest.raises(ValueError, match=field):
        PPOConfig(**{field: value})


@pytest.mark.parametrize("field,value", [
    ("coef", -1.0), ("coef", NAN), ("target", 0.0), ("horizon", -1.0), ("penalty", "kl2"),
    ("where", "both"), ("loss_estimator", "k4"), ("adaptive", 1),
])
def test_kl_config_validate_names_the_field(field, value):
    kl = KLConfig()
    setattr(kl, field, value)
    with pytest.raises(ValueError, match=f"KLConfig.{field} "):
        kl.validate()
    with pytest.raises(ValueError, match=f"KLConfig.{field} "):
        PPOConfig(kl=kl)


def test_config_batch_divisibility_and_presets():
    ppo = PPOConfig(mini_batch_size=4, grad_accum_steps=3)
    assert ppo.backward_batch_size == 12
    with pytest.raises(ValueError, match="batch_size=32 must be divisible by mini_batch_size "
                                         r"\* grad_accum_steps = 4 \* 3 = 12"):
        LearnerConfig(batch_size=32, ppo=ppo).validate()
    assert LearnerConfig(batch_size=24, ppo=ppo).validate().batch_size == 24
    assert PPOConfig().validate() == PPOConfig()
    assert not hasattr(PPOConfig(), "batch_size")  # the batch is the run's, stored once
    imdb = IMDB_PRESET
    assert (imdb.lr, IMDB_BATCH, imdb.mini_batch_size) == (1.41e-5, 256, 256)
    assert (imdb.ppo_epochs, imdb.grad_accum_steps, imdb.kl.penalty) == (4, 1, "full")
    assert (imdb.kl.coef, imdb.vf_coef, imdb.gamma, imdb.lam) == (0.3, 0.1, 1.0, 0.95)
    assert imdb.kl.adaptive and imdb.kl.target == 6.0 and imdb.kl.horizon == 10000
    cory, ppo = gsm8k_preset("cory"), gsm8k_preset("PPO")
    assert (cory.lr, ppo.lr) == (1e-4, 1e-5)
    for cfg in (cory, ppo):
        assert (GSM8K_BATCH, cfg.mini_batch_size, cfg.grad_accum_steps) == (32, 2, 16)
        assert cfg.kl.coef == 0.01 and not cfg.kl.adaptive
    with pytest.raises(ValueError, match="grpo"):
        gsm8k_preset("grpo")


# --------------------------------------------------------------------------- ppo_update
class TinyPolicy(nn.Module):
    """Bigram LM with a value head, implementing the evaluate() contract."""

    def __init__(self, vocab: int = 8, hidden: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.lm = nn.Linear(hidden, vocab)
        self.v = nn.Linear(hidden, 1)

    def evaluate(self, input_ids, attention_mask, n_response, as_object=False):
        h = torch.tanh(self.emb(input_ids[:, -n_response - 1:-1]))
        logsm = torch.log_softmax(self.lm(h), -1)
        logprobs = logsm.gather(-1, input_ids[:, -n_response:, None]).squeeze(-1)
        entropy = -(logsm.exp() * logsm).sum(-1)
        out = {"logprobs": logprobs, "values": self.v(h).squeeze(-1), "entropy": entropy,
               "raw_logprobs": logprobs}
        return SimpleNamespace(**out) if as_object else out


VOCAB, B, P, T = 8, 16, 2, 3


def make_setup(seed=0):
    """A policy and an on-policy batch rewarding an even first response token."""
    torch.manual_seed(seed)
    policy = TinyPolicy(VOCAB)
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (B, P + T), generator=g)
    mask = torch.ones(B, T)
    mask[::3, 2:] = 0.0  # some shorter responses
    with torch.no_grad():
        out = policy.evaluate(input_ids, torch.ones(B, P + T), T)
    scores = torch.where(input_ids[:, P] % 2 == 0, 1.0, -1.0)
    batch = PPOBatch(
        input_ids=input_ids, attention_mask=torch.ones(B, P + T), response_mask=mask,
        old_logprobs=out["logprobs"], old_values=out["values"], ref_logprobs=out["logprobs"],
        rewards=token_rewards(scores, torch.zeros(B, T), mask, kl_coef=0.1),
    )
    return policy, batch


def even_prob(policy, batch):
    """Mean probability of the rewarded first tokens, and the surrogate loss."""
    with torch.no_grad():
        out = policy.evaluate(batch.input_ids, batch.attention_mask, T)
        loss, _ = policy_loss(out["logprobs"], batch.old_logprobs, batch.advantages,
                              batch.response_mask, 0.2)
    even = batch.input_ids[:, P] % 2 == 0
    return out["logprobs"][even, 0].exp().mean().item(), loss.item()


CFG = PPOConfig(lr=1e-2, ppo_epochs=4, mini_batch_size=4, grad_accum_steps=2)


def test_ppo_update_improves_surrogate_and_raises_good_tokens():
    policy, batch = make_setup()
    prepare_advantages(batch, CFG)
    p0, loss0 = even_prob(policy, batch)
    opt = torch.optim.Adam(policy.parameters(), lr=CFG.lr)
    stats = ppo_update(policy, opt, batch, CFG, generator=torch.Generator().manual_seed(0))
    p1, loss1 = even_prob(policy, batch)
    assert p1 > p0 + 0.01
    assert loss1 < loss0 - 0.01
    assert stats["skipped_batches"] == 0 and stats["epochs_run"] == 4
    assert stats["optimizer_steps"] == 4 * B // CFG.backward_batch_size
    expected_keys = {"policy_loss", "value_loss", "clipfrac", "value_clipfrac", "approx_kl",
                     "entropy", "ratio_mean", "skipped_batches", "epochs_run", "grad_norm"}
    assert expected_keys <= stats.keys()
    assert all(math.isfinite(v) for v in stats.values())


def test_ppo_update_skips_nan_advantages_without_changing_params():
    policy, batch = make_setup()
    prepare_advantages(batch, CFG)
    batch.advantages[3, 1] = NAN
    before = copy.deepcopy(policy.state_dict())
    opt = torch.optim.Adam(policy.parameters(), lr=CFG.lr)
    with pytest.warns(RuntimeWarning, match="skipping minibatch"):
        stats = ppo_update(policy, opt, batch, CFG, generator=torch.Generator().manual_seed(0))
    # the row with NaN falls in exactly one of the two optimizer steps per epoch
    assert stats["skipped_batches"] == CFG.ppo_epochs
    assert stats["optimizer_steps"] == CFG.ppo_epochs

    policy2, batch2 = make_setup()
    prepare_advantages(batch2, CFG)
    batch2.advantages[:] = NAN
    opt2 = torch.optim.Adam(policy2.parameters(), lr=CFG.lr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        stats2 = ppo_update(policy2, opt2, batch2, CFG)
    assert stats2["skipped_batches"] == CFG.ppo_epochs * 2 and stats2["optimizer_steps"] == 0
    assert math.isnan(stats2["policy_loss"])
    for k, v in policy2.state_dict().items():
        assert torch.equal(v, before[k])
    assert all(p.grad is None for p in policy2.parameters())


def test_ppo_update_skips_ratio_above_threshold():
    policy, batch = make_setup()
    batch.old_logprobs = batch.old_logprobs - 5.0  # ratio = e^5 > 10
    before = copy.deepcopy(policy.state_dict())
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    with pytest.warns(RuntimeWarning, match="ratio_threshold"):
        stats = ppo_update(policy, opt, batch, CFG)
    assert stats["skipped_batches"] == 8
    assert all(torch.equal(v, before[k]) for k, v in policy.state_dict().items())
    # a token impossible under the current policy (log-prob -inf, e.g. top-k boundary noise)
    policy, batch = make_setup()
    batch.old_logprobs[5, 0] = math.inf
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    with pytest.warns(RuntimeWarning, match="approx_kl=inf"):
        stats = ppo_update(policy, opt, batch, CFG)
    assert stats["skipped_batches"] == CFG.ppo_epochs and math.isfinite(stats["approx_kl"])


def test_ppo_update_deterministic_under_generator():
    runs = []
    for seed in (0, 0, 1):
        policy, batch = make_setup()
        opt = torch.optim.Adam(policy.parameters(), lr=CFG.lr)
        stats = ppo_update(policy, opt, batch, CFG, generator=torch.Generator().manual_seed(seed))
        runs.append((stats, [p.detach().clone() for p in policy.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))
    assert runs[0][0] != runs[2][0]


def test_grad_accumulation_matches_one_big_minibatch():
    finals = []
    # (rows a pass, passes a step, token cap): the capped cases split a step into passes of
    # 1-8 rows by the rows' unpadded widths (2-5 columns here), after sorting them.
    for mbs, acc, cap in ((8, 1, None), (4, 2, None), (2, 4, None), (8, 1, 12), (8, 1, 5)):
        policy, batch = make_setup()
        batch.response_mask = torch.ones(B, T)  # equal token counts per micro-batch
        batch.attention_mask[::2, :2] = 0  # left padding: every other row is 2 columns shorter
        batch.attention_mask[1::4, :1] = 0
        cfg = dataclasses.replace(CFG, ppo_epochs=1, mini_batch_size=mbs, grad_accum_steps=acc,
                                  max_grad_norm=None, max_tokens_per_pass=cap)
        opt = torch.optim.SGD(policy.parameters(), lr=0.5)
        stats = ppo_update(policy, opt, batch, cfg, generator=torch.Generator().manual_seed(3))
        finals.append((stats, torch.cat([p.detach().flatten() for p in policy.parameters()])))
    for stats, params in finals[1:]:
        assert torch.allclose(finals[0][1], params, atol=1e-6)
        for key in ("policy_loss", "value_loss", "approx_kl", "clipfrac"):  # per-row averages
            assert math.isclose(stats[key], finals[0][0][key], rel_tol=1e-5, abs_tol=1e-7), key


def test_forward_passes_pack_rows_under_a_token_budget():
    """Without a cap: plain chunks. With one: each row once, longest first, within the cap."""
    g = torch.Generator().manual_seed(0)
    widths = torch.randint(3, 20, (32,), generator=g)
    mask = (torch.arange(20)[None, :] >= 20 - widths[:, None]).long()  # left-padded rows
    step = torch.randperm(32, generator=g)
    plain = forward_passes(step, mask, rows=8)
    assert [p.tolist() for p in plain] == [p.tolist() for p in step.split(8)]
    for cap in (1, 40, 64, 10**6):
        passes = forward_passes(step, mask, rows=8, max_tokens=cap)
        assert sorted(torch.cat(passes).tolist()) == sorted(step.tolist())
        tops = [int(widths[p].max()) for p in passes]
        assert tops == sorted(tops, reverse=True)  # longest rows first
        for p in passes:
            assert len(p) <= 8
            assert len(p) == 1 or len(p) * int(widths[p].max()) <= cap
        if cap == 10**6:
            assert [len(p) for p in passes] == [8, 8, 8, 8]
        if cap == 1:
            assert len(passes) == 32


def test_ppo_update_kl_in_loss_and_early_stop():
    policy, batch = make_setup()
    batch.ref_logprobs = batch.ref_logprobs - 0.3
    cfg = dataclasses.replace(CFG, kl=KLConfig(where="loss", loss_estimator="k3"))
    opt = torch.optim.Adam(policy.parameters(), lr=CFG.lr)
    with pytest.raises(ValueError, match="needs kl_coef"):
        ppo_update(policy, opt, batch, cfg)
    stats = ppo_update(policy, opt, batch, cfg, kl_coef=0.5, evaluate_kwargs={"as_object": True})
    assert stats["kl_loss"] > 0 and stats["skipped_batches"] == 0
    policy, batch = make_setup()
    cfg = dataclasses.replace(CFG, early_stop_kl=1e-12)
    opt = torch.optim.Adam(policy.parameters(), lr=CFG.lr)
    stats = ppo_update(policy, opt, batch, cfg)
    assert stats["epochs_run"] == 1


def test_batch_index_slices_every_tensor():
    _, batch = make_setup()
    prepare_advantages(batch, CFG)
    mb = batch.index(torch.tensor([3, 0]))
    assert len(mb) == 2
    assert torch.equal(mb.input_ids, batch.input_ids[[3, 0]])
    assert torch.equal(mb.advantages, batch.advantages[[3, 0]])
    assert batch.index(slice(0, 5)).rewards.shape == (5, T)


def test_ppo_update_hooks_backward_and_all_ok():
    calls = []
    policy, batch = make_setup()
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    stats = ppo_update(policy, opt, batch, CFG, backward=lambda loss: (calls.append(1),
                                                                        loss.backward()))
    assert len(calls) == CFG.ppo_epochs * B // CFG.mini_batch_size
    assert stats["optimizer_steps"] == CFG.ppo_epochs * 2
    before = copy.deepcopy(policy.state_dict())
    with pytest.warns(RuntimeWarning, match="another rank"):
        stats = ppo_update(policy, opt, batch, CFG, all_ok=lambda ok: False)
    assert stats["skipped_batches"] == CFG.ppo_epochs * 2
    assert all(torch.equal(v, before[k]) for k, v in policy.state_dict().items())
