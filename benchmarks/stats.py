"""The statistics behind the claims: paired intervals over seeds, frontiers and trends.

Everything is plain numpy on per-seed numbers. Conventions (the report prints them too):

* **Intervals** (`agents.stats.mean_interval`) are 95% Student-t intervals of a mean over
  seeds (for a comparison: of the per-seed paired differences). The **detectable effect** is
  the true mean a test at 5% would find 80% of the time with that spread and that many seeds:
  (t_0.975 + t_0.8) · sd / √n.
* **Smoothing**: a trajectory of evaluation points is smoothed by a centred 3-point moving
  average over points (each end averages itself and its one neighbour).
* **Frontier**: a seed's best reward at a KL budget k is the running maximum of its smoothed
  rewards over the points sorted by KL, linearly interpolated at k; the KL it needs for reward
  r is where that running maximum first reaches r (interpolated). Both are undefined (NaN)
  outside what the seed reached.
* **Trend**: the change of a curve over a span of iterations is its least-squares slope over
  those points times the span.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from agents.stats import Interval, mean_interval, t_quantile

__all__ = ["Interval", "mean_interval", "t_quantile", "smooth", "envelope", "reward_at_kl",
           "kl_at_reward", "change"]


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


def reward_at_kl(kl: Sequence[float], reward: Sequence[float], budget: float) -> float:
    """The best reward reached within a KL budget (interpolated; NaN beyond the largest KL)."""
    k, r = envelope(kl, reward)
    if not len(k) or budget > k[-1] or budget < k[0]:
        return math.nan
    return float(np.interp(budget, k, r))


def kl_at_reward(kl: Sequence[float], reward: Sequence[float], target: float) -> float:
    """The KL at which the best reward first reaches `target` (NaN if it never does)."""
    k, r = envelope(kl, reward)
    if not len(k) or r[-1] < target:
        return math.nan
    i = int(np.argmax(r >= target))
    if i == 0 or r[i] == r[i - 1]:
        return float(k[i])
    return float(k[i - 1] + (target - r[i - 1]) * (k[i] - k[i - 1]) / (r[i] - r[i - 1]))


def change(iterations: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of y over iterations, times their span (NaN under 2 points)."""
    x, y = np.asarray(iterations, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 or x[-1] == x[0]:
        return math.nan
    slope = np.polyfit(x, y, 1)[0]
    return float(slope * (x[-1] - x[0]))
