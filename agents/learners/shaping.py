"""Reward shaping of token-level PPO: the KL coefficient's controllers, score statistics,
and the per-token rewards (-kl_coef * KL on every response token, the score on the last one)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor


# --------------------------------------------------------------------------- KL controllers
class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. (2019)."""

    def __init__(self, coef: float, target: float, horizon: float):
        self.coef, self.target, self.horizon = float(coef), float(target), float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        """coef <- coef * (1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon)."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * n_steps / self.horizon
        return self.coef

    def state_dict(self) -> dict[str, float]:
        """Checkpointable state."""
        return {"kl_coef": self.coef, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        """Restore from state_dict()."""
        self.coef, self.target = float(state["kl_coef"]), float(state["target"])
        self.horizon = float(state["horizon"])


class FixedKLController:
    """Constant KL coefficient."""

    def __init__(self, coef: float):
        self.coef = float(coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        """No-op; returns the fixed coefficient."""
        return self.coef

    def state_dict(self) -> dict[str, float]:
        """Checkpointable state."""
        return {"kl_coef": self.coef}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        """Restore from state_dict()."""
        self.coef = float(state["kl_coef"])


def make_kl_controller(cfg: Any, batch_size: int) -> AdaptiveKLController | FixedKLController:
    """The controller a PPOConfig's `kl` asks for (adaptive if kl.adaptive) for a run of
    `batch_size` episodes per iteration."""
    if cfg.kl.adaptive:
        return AdaptiveKLController(cfg.kl.coef, cfg.kl.target, cfg.kl_horizon(batch_size))
    return FixedKLController(cfg.kl.coef)


# --------------------------------------------------------------------------- scores
class RunningMoments:
    """Running mean / variance of scores across batches (parallel-variance update)."""

    def __init__(self) -> None:
        self.mean, self.var, self.count = 0.0, 0.0, 0  # var is the population variance

    @property
    def std(self) -> float:
        """Running std with Bessel's correction (1.0 before two samples have been seen)."""
        if self.count < 2:
            return 1.0
        return math.sqrt(self.var * self.count / (self.count - 1))

    def update(self, x: Tensor) -> tuple[float, float]:
        """Fold a batch into the moments; return the batch's (mean, std with ddof=1)."""
        x = x.detach().double().flatten()
        n = x.numel()
        if n == 0:
            return float("nan"), float("nan")
        b_mean = x.mean().item()
        b_var = x.var(unbiased=False).item() if n > 1 else 0.0
        total = self.count + n
        delta = b_mean - self.mean
        m2 = self.var * self.count + b_var * n + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.var, self.count = m2 / total, total
        b_std = math.sqrt(b_var * n / (n - 1)) if n > 1 else float("nan")
        return b_mean, b_std

    def state_dict(self) -> dict[str, float]:
        """Checkpointable state."""
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        """Restore from state_dict()."""
        self.mean, self.var = float(state["mean"]), float(state["var"])
        self.count = int(state["count"])


def scale_scores(scores: Tensor, moments: RunningMoments, cfg: Any,
                 gather: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """Update moments, then score/(std+eps) or (score-mean)/(std+eps), then clip.

    ``use_score_norm`` implies scaling (TRL silently ignored it without scaling). ``gather``
    returns every rank's scores, so the moments see the global batch.
    """
    eps = 1e-8
    if cfg.use_score_scaling or cfg.use_score_norm:
        moments.update(scores.float() if gather is None else gather(scores.float()))
        if cfg.use_score_norm:
            scores = (scores - moments.mean) / (moments.std + eps)
        else:
            scores = scores / (moments.std + eps)
    if cfg.score_clip is not None:
        scores = scores.clamp(-cfg.score_clip, cfg.score_clip)
    return scores


def token_rewards(scores: Tensor, kl: Tensor, mask: Tensor, kl_coef: float) -> Tensor:
    """Per-token rewards: -kl_coef*kl on masked tokens plus the score on each row's last one."""
    valid = mask > 0
    rewards = torch.where(valid, -kl_coef * kl, torch.zeros_like(kl))
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(valid, positions, torch.full_like(positions, -1)).max(dim=1).values
    rows = torch.nonzero(last >= 0).squeeze(1)  # zero-length rows get no score
    rewards[rows, last[rows]] += scores[rows].to(rewards.dtype)
    return rewards


def truncated_is_weights(turn: Any, cap: float) -> Tensor | None:
    """min(pi_trainer / pi_sampler, cap) per response token of a turn sampled on the fast path
    (its `sampler_logprobs`), 0 on padding; None for a turn the trainer's own passes sampled."""
    sampler = getattr(turn, "sampler_logprobs", None)
    if sampler is None:
        return None
    ratio = torch.exp((turn.logprobs - sampler).clamp(max=math.log(cap)))
    return ratio * turn.response_mask
