"""Matched points on the reward–KL frontier: the levels every seed shares, the KL ratio at
matched reward and the reward gap at matched KL, read per seed (`benchmarks.evidence.claims`
decides on them, `benchmarks.report` prints them)."""

from __future__ import annotations

import math

import numpy as np

from benchmarks.evidence.intervals import Interval, mean_interval
from benchmarks.evidence.records import Trajectory
from benchmarks.evidence.stats import common_range, envelope, kl_at_reward, reward_at_kl

LEVELS = (0.25, 0.5, 0.75, 1.0)  # matched points: these fractions of the shared range
KL_FLOOR = 1e-6  # log KL of a point at KL 0


def log_kl(x: float) -> float:
    """log of a KL, floored at KL_FLOOR (NaN stays NaN)."""
    return math.log(max(x, KL_FLOOR)) if math.isfinite(x) else math.nan


def reward_levels(curves: list[Trajectory]) -> list[float]:
    """LEVELS of the best-reward range every curve observed (none when they share none)."""
    lo, hi = common_range([(t.kl, t.reward) for t in curves], "reward")
    return [min(lo + f * (hi - lo), hi) for f in LEVELS] if hi > lo else []


def kl_levels(curves: list[Trajectory]) -> list[float]:
    """LEVELS of the KL range every curve observed (none when they share none)."""
    lo, hi = common_range([(t.kl, t.reward) for t in curves], "kl")
    return [min(lo + f * (hi - lo), hi) for f in LEVELS] if hi > lo else []


SLIVER = 0.25  # a matched range under this share of the widest seed's own range is a sliver


def sliver(curves: list[Trajectory], axis: str) -> str:
    """A note when the range every curve shares is a sliver of the widest curve's own range
    (the figure then rests on little of what the methods covered), else ""."""
    lo, hi = common_range([(t.kl, t.reward) for t in curves], axis)
    own = [(r[-1] - r[0]) if axis == "reward" else (k[-1] - k[0])
           for k, r in (envelope(t.kl, t.reward) for t in curves)]
    widest = max(own, default=0.0)
    if not hi > lo or not widest > 0 or (hi - lo) / widest >= SLIVER:
        return ""
    return (f" The shared {axis} range is a sliver ({100 * (hi - lo) / widest:.0f}% of the "
            f"widest seed's own): this figure rests on little overlap.")


def log_kl_ratios(a: list[Trajectory], b: list[Trajectory], levels: list[float]) -> list[float]:
    """Per seed, the mean over reward levels of log(KL_a / KL_b) at that reward."""
    return [float(np.mean([log_kl(kl_at_reward(x.kl, x.reward, r))
                           - log_kl(kl_at_reward(y.kl, y.reward, r)) for r in levels]))
            if levels else math.nan for x, y in zip(a, b)]


def matched_kl_ratio(a: list[Trajectory], b: list[Trajectory]) -> tuple[Interval, list[float]]:
    """log(KL_a / KL_b) at matched rewards (LEVELS of the best-reward range every seed of both
    observed), per seed; (interval of the mean, the levels)."""
    levels = reward_levels(a + b)
    return mean_interval(log_kl_ratios(a, b, levels)), levels


def matched_reward_gap(a: list[Trajectory], b: list[Trajectory]) -> tuple[Interval, list[float]]:
    """reward_a − reward_b at matched KL budgets (LEVELS of the KL range every seed of both
    observed), per seed; (interval of the mean, the budgets)."""
    budgets = kl_levels(a + b)
    per_seed = [float(np.mean([reward_at_kl(x.kl, x.reward, k) - reward_at_kl(y.kl, y.reward, k)
                               for k in budgets])) if budgets else math.nan
                for x, y in zip(a, b)]
    return mean_interval(per_seed), budgets


def ratio_text(iv: Interval) -> str:
    """A log-ratio interval as a ratio with its interval."""
    if iv.n == 0 or not math.isfinite(iv.mean):
        return "n/a"
    e = lambda x: f"{math.exp(x):.3g}" if math.isfinite(x) else ("inf" if x > 0 else "0")  # noqa: E731
    if iv.n == 1:
        return f"{e(iv.mean)}× (1 seed: no interval)"
    return f"{e(iv.mean)}× [95% CI {e(iv.low)}, {e(iv.high)}; n={iv.n} seeds]"


def levels_text(xs: list[float]) -> str:
    """Matched points as text."""
    return ", ".join(f"{x:.3g}" for x in xs) or "(none shared)"
