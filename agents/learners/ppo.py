"""Token-level PPO for LLM fine-tuning: the core maths and one update routine.

Everything here is pure torch. Response tensors are (B, T) and come with a float ``mask``
that is 1 on response tokens and 0 after EOS / on padding. Masked positions may hold garbage
(even NaN or -inf); every function ignores them. The KL coefficient (`kl_coef`) and everything
about it is one `KLConfig` (``PPOConfig.kl``, `agents.learners.ppo_config`).

Where the KL acts (``kl.where``: "reward", the paper's and TRL's way, or "loss", GRPO's)
and why the exact ``full`` KL gives no direct gradient as a reward: docs/learners.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from ..llm.logits import full_kl
from .credit import credit_span, episodes_of, split_turns
from .ppo_config import KL_LOSS_ESTIMATORS, KL_PENALTIES, LOSS_AGGS, PPOConfig
from .steps import clip_and_step, forward_passes, step_slices

UPDATE_STATS = ("policy_loss", "value_loss", "loss", "kl_loss", "clipfrac", "value_clipfrac",
                "approx_kl", "entropy", "ratio_mean", "grad_norm")  # averaged over steps


# --------------------------------------------------------------------------- masked stats
def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of x over positions where mask > 0 (0 if there are none)."""
    mask = mask if mask.is_floating_point() else mask.float()
    x = torch.where(mask > 0, x, torch.zeros_like(x)) * mask
    if dim is None:
        return x.sum() / mask.sum().clamp_min(1e-8)
    return x.sum(dim) / mask.sum(dim).clamp_min(1e-8)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of x over masked positions, with Bessel's correction by default."""
    centered = x - masked_mean(x, mask)
    var = masked_mean(centered * centered, mask)
    n = mask.sum()
    if unbiased and n > 1:
        var = var * n / (n - 1)
    return var


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """Normalise x to unit variance (and zero mean) over masked positions; 0 elsewhere."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        out = out + mean
    return torch.where(mask > 0, out, torch.zeros_like(out))


def aggregate(x: Tensor, mask: Tensor, mode: str = "token-mean") -> Tensor:
    """Reduce per-token terms (B, T) to a loss: the mean over all tokens ("token-mean"), the
    mean of each answer's token mean ("seq-mean-token-mean", GRPO), or the mean of each
    answer's token sum over the constant T ("seq-mean-token-sum", Dr. GRPO)."""
    if mode == "token-mean":
        return masked_mean(x, mask)
    mask = mask if mask.is_floating_point() else mask.float()
    per_answer = torch.where(mask > 0, x, torch.zeros_like(x)).mul(mask).sum(1)
    if mode == "seq-mean-token-mean":
        return (per_answer / mask.sum(1).clamp_min(1.0)).mean()
    if mode == "seq-mean-token-sum":
        return (per_answer / mask.shape[1]).mean()
    raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {mode!r}")


# --------------------------------------------------------------------------- KL
def kl_per_token(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mode: str,
    logsoftmax: Tensor | None = None,
    ref_logsoftmax: Tensor | None = None,
) -> Tensor:
    """Per-token KL penalty (B, T) for mode kl | abs | mse | full (unmasked)."""
    if mode == "kl":
        return logprobs - ref_logprobs
    if mode == "abs":
        return (logprobs - ref_logprobs).abs()
    if mode == "mse":
        return 0.5 * (logprobs - ref_logprobs).square()
    if mode == "full":
        if logsoftmax is None or ref_logsoftmax is None:
            raise ValueError("kl mode 'full' needs logsoftmax and ref_logsoftmax (B, T, V)")
        return full_kl(logsoftmax, ref_logsoftmax)
    raise ValueError(f"kl mode must be one of {KL_PENALTIES}, got {mode!r}")


def kl_loss_term(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, estimator: str,
                 agg: str = "token-mean") -> Tensor:
    """The k1/k2/k3 KL estimator, d = ref - logp, reduced by `aggregate` (differentiable)."""
    d = torch.where(mask > 0, ref_logprobs - logprobs, torch.zeros_like(logprobs))
    if estimator == "k1":
        k = -d
    elif estimator == "k2":
        k = 0.5 * d.square()
    elif estimator == "k3":
        d = d.clamp(-20.0, 20.0)  # keeps exp(d) finite in float32
        k = torch.exp(d) - d - 1.0
    else:
        raise ValueError(f"estimator must be one of {KL_LOSS_ESTIMATORS}, got {estimator!r}")
    return aggregate(k, mask, agg)


# --------------------------------------------------------------------------- GAE
@torch.no_grad()
def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
        ) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over T with V_T = 0, stepping over masked columns (the
    next valid value bootstraps across a gap); returns (advantages, returns)."""
    valid, zero = mask > 0, torch.zeros_like(values)
    rewards, values = torch.where(valid, rewards, zero), torch.where(valid, values, zero)
    advantages = torch.zeros_like(rewards)
    last_adv, next_value = torch.zeros_like(rewards[:, 0]), torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last_adv = torch.where(valid[:, t], delta + gamma * lam * last_adv, last_adv)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        advantages[:, t] = last_adv
    returns = advantages + values
    return advantages * mask, returns * mask


# --------------------------------------------------------------------------- losses
def policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                cliprange: float, agg: str = "token-mean", is_weights: Tensor | None = None
                ) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate max(-A*r, -A*clip(r)) reduced by `aggregate`, each token's term times
    its truncated importance weight when a different sampler drew it; stats are detached."""
    valid = mask > 0
    log_ratio = torch.where(valid, logprobs - old_logprobs, torch.zeros_like(logprobs))
    advantages = torch.where(valid, advantages, torch.zeros_like(advantages))
    ratio = torch.exp(log_ratio)
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    per_token = torch.maximum(pg1, pg2)
    if is_weights is not None:
        per_token = per_token * is_weights
    loss = aggregate(per_token, mask, agg)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((pg2 > pg1).float(), mask),
            "approx_kl": 0.5 * masked_mean(log_ratio.square(), mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
        if is_weights is not None:
            stats["is_weight"] = masked_mean(is_weights, mask)
    return loss, stats


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor,
               cliprange_value: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss 0.5*masked_mean(max((V-R)^2, (V_clip-R)^2))."""
    valid = mask > 0
    values = torch.where(valid, values, torch.zeros_like(values))
    old_values = torch.where(valid, old_values, torch.zeros_like(old_values))
    returns = torch.where(valid, returns, torch.zeros_like(returns))
    v_clip = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    vf1, vf2 = (values - returns).square(), (v_clip - returns).square()
    loss = 0.5 * masked_mean(torch.maximum(vf1, vf2), mask)
    with torch.no_grad():
        stats = {"value_clipfrac": masked_mean((vf2 > vf1).float(), mask)}
    return loss, stats


# --------------------------------------------------------------------------- batch
@dataclass
class PPOBatch:
    """One rollout batch; the response is the last T columns of input_ids."""

    input_ids: Tensor  # (B, L) long
    attention_mask: Tensor  # (B, L)
    response_mask: Tensor  # (B, T) float
    old_logprobs: Tensor  # (B, T)
    old_values: Tensor  # (B, T)
    ref_logprobs: Tensor  # (B, T)
    rewards: Tensor  # (B, T), already shaped per-token rewards
    advantages: Tensor | None = None  # (B, T), set by prepare_advantages
    returns: Tensor | None = None  # (B, T), set by prepare_advantages
    scores: Tensor | None = None  # (B,) the shaped sequence scores inside `rewards`
    rounds: int = 1  # rows are `rounds` blocks of one agent's turns (round-major)
    is_weights: Tensor | None = None  # (B, T) min(pi_old / pi_sampler, cap): the fast path's

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def index(self, idx: Tensor | slice) -> PPOBatch:
        """Rows idx of every tensor (a minibatch)."""
        def take(t: Tensor | None) -> Tensor | None:
            if not torch.is_tensor(t):
                return t
            return t[idx.to(t.device) if isinstance(idx, Tensor) else idx]

        return PPOBatch(**{f.name: take(getattr(self, f.name)) for f in fields(self)})

    def to(self, device: torch.device | str) -> PPOBatch:
        """A copy on device."""
        return PPOBatch(**{f.name: v.to(device) if torch.is_tensor(v) else v
                           for f in fields(self) for v in [getattr(self, f.name)]})


@torch.no_grad()
def prepare_advantages(batch: PPOBatch, cfg: PPOConfig) -> PPOBatch:
    """Fill batch.advantages / batch.returns by GAE (whitened if cfg says so), across an
    agent's turns when `cfg.credit` says so (`agents.learners.credit`); returns batch."""
    mask, r = batch.response_mask, credit_span(batch.rounds, cfg.credit)
    adv, ret = (split_turns(x, r) for x in gae(episodes_of(batch.rewards.float(), r), episodes_of(
        batch.old_values.float(), r), episodes_of(mask, r), cfg.gamma, cfg.lam))
    if cfg.whiten_advantages:
        adv = masked_whiten(adv, mask)
    batch.advantages, batch.returns = adv, ret
    return batch


# --------------------------------------------------------------------------- update
def _field(out: Any, name: str, required: bool = True) -> Tensor | None:
    value = out.get(name) if isinstance(out, Mapping) else getattr(out, name, None)
    if value is None and required:
        raise KeyError(f"policy.evaluate() output is missing {name!r}")
    return value


def _minibatch_loss(policy: Any, mb: PPOBatch, cfg: PPOConfig, kl_coef: float,
                    evaluate_kwargs: Mapping[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
    T, mask = mb.response_mask.shape[1], mb.response_mask
    out = policy.evaluate(mb.input_ids, mb.attention_mask, n_response=T, **evaluate_kwargs)
    logprobs, values = _field(out, "logprobs").float(), _field(out, "values").float()
    if logprobs.shape != mask.shape or values.shape != mask.shape:
        raise ValueError(f"evaluate() returned logprobs {tuple(logprobs.shape)}, values "
                         f"{tuple(values.shape)}; expected {tuple(mask.shape)}")
    pg, stats = policy_loss(logprobs, mb.old_logprobs.float(), mb.advantages, mask,
                            cfg.cliprange, cfg.loss_agg, mb.is_weights)
    vf, vstats = value_loss(values, mb.old_values.float(), mb.returns, mask,
                            cfg.cliprange_value)
    entropy = _field(out, "entropy", required=cfg.entropy_coef > 0)
    entropy = masked_mean(entropy.float(), mask) if entropy is not None else pg.new_zeros(())
    loss = pg + cfg.vf_coef * vf
    if cfg.entropy_coef:  # else a statistic only: no backward through (B, T, V) tensors
        loss = loss - cfg.entropy_coef * entropy
    kl_loss = pg.new_zeros(())
    if cfg.kl.where == "loss":
        raw = _field(out, "raw_logprobs", required=False)
        raw = logprobs if raw is None else raw.float()
        kl_loss = kl_loss_term(raw, mb.ref_logprobs.float(), mask, cfg.kl.loss_estimator,
                               cfg.loss_agg)
        loss = loss + kl_coef * kl_loss
    stats.update(vstats, policy_loss=pg.detach(), value_loss=vf.detach(), loss=loss.detach(),
                 entropy=entropy.detach(), kl_loss=kl_loss.detach())
    return loss, stats


def _gradients(policy: Any, batch: PPOBatch, step_idx: Tensor, cfg: PPOConfig, kl_coef: float,
               evaluate_kwargs: dict, backward: Callable, all_ok: Callable
               ) -> tuple[str | None, list[tuple[int, dict[str, Tensor]]]]:
    """One optimizer step's gradients, a forward pass at a time: (why the step is skipped or
    None, each pass's (rows, stats)). A pass with a non-finite loss or a ratio past the
    threshold (on any rank) skips the step."""
    step_stats, reason = [], None
    for micro_idx in forward_passes(step_idx, batch.attention_mask, cfg.mini_batch_size,
                                    cfg.max_tokens_per_pass):
        loss, stats = _minibatch_loss(policy, batch.index(micro_idx), cfg, kl_coef, evaluate_kwargs)
        ratio, kl = stats["ratio_mean"].item(), stats["approx_kl"].item()
        if not all(map(math.isfinite, (loss.item(), ratio, kl))):
            reason = f"non-finite loss={loss.item()}, ratio={ratio}, approx_kl={kl}"
        elif ratio > cfg.ratio_threshold:
            reason = f"mean ratio {ratio:.3g} > ratio_threshold {cfg.ratio_threshold}"
        if not all_ok(reason is None):
            reason = reason or "another rank skipped this minibatch"
        if reason:
            break
        backward(loss * (len(micro_idx) / len(step_idx)))
        step_stats.append((len(micro_idx), stats))
    return reason, step_stats


def ppo_update(policy: Any, optimizer: torch.optim.Optimizer, batch: PPOBatch, cfg: PPOConfig,
               generator: torch.Generator | None = None, kl_coef: float | None = None,
               evaluate_kwargs: Mapping[str, Any] | None = None,
               backward: Callable[[Tensor], None] | None = None,
               all_ok: Callable[[bool], bool] | None = None) -> dict[str, float]:
    """Run cfg.ppo_epochs of clipped PPO on batch; return stats averaged over steps taken.

    ``evaluate_kwargs`` go to ``policy.evaluate`` (``sampling=...``: the rollout's distribution).
    Under DDP pass ``backward=accelerator.backward`` and an ``all_ok`` that ANDs a flag over
    ranks, so every rank skips the same minibatches (a one-sided skip would hang the all-reduce).
    """
    backward, all_ok, evaluate_kwargs = backward or Tensor.backward, all_ok or bool, \
        dict(evaluate_kwargs or {})
    if cfg.kl.where == "loss" and kl_coef is None:
        raise ValueError("kl.where='loss' needs kl_coef (the KL controller's current value)")
    if batch.advantages is None or batch.returns is None:
        prepare_advantages(batch, cfg)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
    B, step_size = len(batch), cfg.backward_batch_size
    sums: dict[str, float] = {}
    steps = skipped = epochs_run = 0
    for epoch in range(cfg.ppo_epochs):
        epoch_kl = []
        for start, step_idx in step_slices(B, step_size, generator):
            optimizer.zero_grad(set_to_none=True)
            reason, step_stats = _gradients(policy, batch, step_idx, cfg, kl_coef or 0.0,
                                            evaluate_kwargs, backward, all_ok)
            grad_norm = clip_and_step(optimizer, params, max_norm, reason, all_ok,
                                      f"PPO: skipping minibatch (epoch {epoch}, start {start})")
            if grad_norm is None:
                skipped += 1
                continue
            steps += 1
            for key in step_stats[0][1]:  # averaged over the step's rows
                value = sum(n * s[key].item() for n, s in step_stats) / len(step_idx)
                sums[key] = sums.get(key, 0.0) + value
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm
            epoch_kl.append(sum(n * s["approx_kl"].item() for n, s in step_stats) / len(step_idx))
        epochs_run += 1
        if cfg.early_stop_kl is not None:  # every rank must agree, or the next pass hangs
            calm = not epoch_kl or sum(epoch_kl) / len(epoch_kl) <= cfg.early_stop_kl
            if not all_ok(calm):
                break
    optimizer.zero_grad(set_to_none=True)
    sampled = ("is_weight",) if "is_weight" in sums else ()  # drawn by another sampler
    return {**{k: sums[k] / steps if steps else math.nan for k in UPDATE_STATS + sampled},
            "skipped_batches": float(skipped), "epochs_run": float(epochs_run),
            "optimizer_steps": float(steps)}
