"""The statistics behind the claims: paired intervals over seeds, frontiers and trends.

Everything is plain numpy on per-seed numbers. Conventions (the report prints them too):

* **Intervals** (`benchmarks.evidence.intervals.mean_interval`) are 95% Student-t intervals of a
  mean over seeds (for a comparison: of the per-seed paired differences). The **detectable
  effect** is the true mean a test would find 80% of the time with that spread and that many seeds.
* **Smoothing**: a trajectory of evaluation points is smoothed by a centred 3-point moving
  average over points (each end averages itself and its one neighbour).
* **Frontier**: a seed's best reward at a KL budget k is the running maximum of its raw
  rewards over the points sorted by KL; between two observed points it is the monotone cubic
  (PCHIP) through them in √KL (KL grows with the square of a small policy change), so that one
  frontier sampled sparsely or densely reads the same. The KL it needs for reward r is where
  that curve first reaches r (its inverse). Both are NaN outside the observed points: nothing
  is extrapolated, below or above.
* **Matched levels** lie inside the range every seed of every compared method observed
  (`common_range`); levels outside it are dropped, never seeds.
* **Trend**: the change of a curve over a span of iterations is its least-squares slope over
  those points times the span.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.interpolate import PchipInterpolator
from scipy.optimize import brentq

__all__ = ["smooth", "envelope", "reward_at_kl", "kl_at_reward", "common_range", "change"]


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


def _nodes(kl: Sequence[float], reward: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The envelope as interpolation nodes: √KL (strictly increasing; of equal KLs the last,
    which holds their best) and the best reward."""
    k, r = envelope(kl, reward)
    x = np.sqrt(np.maximum(k, 0.0))
    last = np.r_[x[1:] > x[:-1], True] if len(x) else x > 0
    return x[last], r[last]


def _frontier_at(x: np.ndarray, y: np.ndarray, at: float) -> float:
    """The monotone cubic (PCHIP) through the nodes, at √KL `at` (inside their range)."""
    i = int(np.searchsorted(x, at))
    if len(x) == 1 or x[min(i, len(x) - 1)] == at:
        return float(y[min(i, len(x) - 1)])
    return float(PchipInterpolator(x, y)(at))


def reward_at_kl(kl: Sequence[float], reward: Sequence[float], budget: float) -> float:
    """The best reward reached within a KL budget (NaN outside the observed KL range)."""
    x, y = _nodes(kl, reward)
    at = math.sqrt(max(budget, 0.0))
    if not len(x) or budget < 0 or not x[0] <= at <= x[-1]:
        return math.nan
    return _frontier_at(x, y, at)


def kl_at_reward(kl: Sequence[float], reward: Sequence[float], target: float) -> float:
    """The KL at which the best reward first reaches `target` (NaN below the first observed
    point's reward or above the best one): `reward_at_kl` inverted."""
    x, y = _nodes(kl, reward)
    if not len(x) or not y[0] <= target <= y[-1]:
        return math.nan
    i = int(np.argmax(y >= target))
    if y[i] == target or i == 0:
        return float(x[i]) ** 2
    curve = PchipInterpolator(x, y)
    return brentq(lambda v: float(curve(v)) - target, x[i - 1], x[i], xtol=1e-12) ** 2


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
