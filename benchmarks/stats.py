"""The statistics behind the claims: paired intervals over seeds, frontiers and trends.

Everything is plain numpy on per-seed numbers. Conventions (the report prints them too):

* **Intervals** (`agents.training.stats.mean_interval`) are 95% Student-t intervals of a mean over
  seeds (for a comparison: of the per-seed paired differences). The **detectable effect** is
  the true mean a test would find 80% of the time with that spread and that many seeds.
* **Smoothing**: a trajectory of evaluation points is smoothed by a centred 3-point moving
  average over points (each end averages itself and its one neighbour).
* **Frontier**: a seed's best reward at a KL budget k is the running maximum of its raw
  rewards over the points sorted by KL; between two observed points reward is interpolated
  linearly in log-KL (in √KL on a segment that starts at KL 0). The KL it needs for
  reward r is where that running maximum first reaches r, interpolated the same way. Both are
  NaN outside the observed points: nothing is extrapolated, below or above.
* **Matched levels** lie inside the range every seed of every compared method observed
  (`common_range`); levels outside it are dropped, never seeds.
* **Trend**: the change of a curve over a span of iterations is its least-squares slope over
  those points times the span.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from agents.training.stats import Interval, mean_interval, t_quantile

__all__ = ["Interval", "mean_interval", "t_quantile", "smooth", "envelope", "reward_at_kl",
           "kl_at_reward", "common_range", "change"]


def smooth(y: Sequence[float]) -> np.ndarray:
    """Centred 3-point moving average over points (the ends average two points)."""
    y = np.asarray(y, dtype=np.float64)
    if len(y) < 3:
        return y.copy()
    out = np.convolve(y, np.ones(3) / 3, mode="same")
    out[0], out[-1] = (y[0] + y[1]) / 2, (y[-2] + y[-1]) / 2
    return out


def envelope(kl: Sequence[float], reward: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Points sorted by KL and the running maximum of reward over them."""
    order = np.argsort(np.asarray(kl, dtype=np.float64), kind="stable")
    k = np.asarray(kl, dtype=np.float64)[order]
    return k, np.maximum.accumulate(np.asarray(reward, dtype=np.float64)[order])


def _between(x0: float, x1: float, f: float) -> float:
    """The KL a fraction f of the way from x0 to x1: geometric between positive KLs, and
    √KL linear from KL 0 (KL grows with the square of a small policy change)."""
    if x0 > 0 and x1 > 0:
        return math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0)))
    return (math.sqrt(max(x0, 0.0)) + f * (math.sqrt(max(x1, 0.0)) - math.sqrt(max(x0, 0.0)))) ** 2


def _fraction(x0: float, x1: float, x: float) -> float:
    """Where KL x lies between x0 and x1 as a fraction, on _between's scale."""
    if x1 == x0:
        return 0.0
    if x0 > 0 and x1 > 0:
        return (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    lo, hi = math.sqrt(max(x0, 0.0)), math.sqrt(max(x1, 0.0))
    return (math.sqrt(max(x, 0.0)) - lo) / (hi - lo)


def reward_at_kl(kl: Sequence[float], reward: Sequence[float], budget: float) -> float:
    """The best reward reached within a KL budget (NaN outside the observed KL range)."""
    k, r = envelope(kl, reward)
    if not len(k) or not k[0] <= budget <= k[-1]:
        return math.nan
    i = int(np.searchsorted(k, budget, side="left"))
    if k[i] == budget:
        return float(r[i])
    f = _fraction(k[i - 1], k[i], budget)
    return float(r[i - 1] + f * (r[i] - r[i - 1]))


def kl_at_reward(kl: Sequence[float], reward: Sequence[float], target: float) -> float:
    """The KL at which the best reward first reaches `target` (NaN below the first observed
    point's reward or above the best one)."""
    k, r = envelope(kl, reward)
    if not len(k) or not r[0] <= target <= r[-1]:
        return math.nan
    i = int(np.argmax(r >= target))
    if i == 0 or r[i] == r[i - 1]:
        return float(k[i])
    return _between(float(k[i - 1]), float(k[i]), (target - r[i - 1]) / (r[i] - r[i - 1]))


def common_range(curves: Sequence[tuple[Sequence[float], Sequence[float]]], axis: str
                 ) -> tuple[float, float]:
    """The (low, high) of KL (axis "kl") or of best reward (axis "reward") that every
    (kl, reward) curve observed; low >= high when they share none."""
    ends = []
    for kl, reward in curves:
        k, r = envelope(kl, reward)
        ends.append((k[0], k[-1]) if axis == "kl" else (r[0], r[-1]))
    if not ends:
        return math.nan, math.nan
    return max(e[0] for e in ends), min(e[1] for e in ends)


def change(iterations: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of y over iterations, times their span (NaN under 2 points)."""
    x, y = np.asarray(iterations, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 or x[-1] == x[0]:
        return math.nan
    slope = np.polyfit(x, y, 1)[0]
    return float(slope * (x[-1] - x[0]))
