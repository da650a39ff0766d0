"""The statistics behind the claims: paired intervals over seeds, frontiers and trends.

Everything is plain numpy on per-seed numbers. Conventions (the report prints them too):

* **Intervals** are 95% Student-t intervals of a mean over seeds (for a comparison: of the
  per-seed paired differences). The **detectable effect** is the true mean a test at 5% would
  find 80% of the time with that spread and that many seeds: (t_0.975 + t_0.8) · sd / √n.
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
from dataclasses import dataclass

import numpy as np

# two-sided 95% (0.975) and 80%-power (0.8) quantiles of Student's t by degrees of freedom;
# a df between entries uses the entry below it (a slightly wider interval)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000}
_T80 = {1: 1.376, 2: 1.061, 3: 0.978, 4: 0.941, 5: 0.920, 6: 0.906, 7: 0.896, 8: 0.889,
        9: 0.883, 10: 0.879, 12: 0.873, 15: 0.866, 20: 0.860, 30: 0.854, 60: 0.848}


def t_quantile(df: int, table: dict[int, float] = _T975) -> float:
    """Student's t quantile from a table (df >= 1; large df: the largest entry's)."""
    if df < 1:
        return math.inf
    return table[max(k for k in table if k <= df)]


@dataclass(frozen=True)
class Interval:
    """A mean over n seeds with its 95% interval and the smallest effect it could detect."""

    mean: float
    low: float
    high: float
    n: int
    detectable: float

    def __str__(self) -> str:
        if self.n == 0 or not math.isfinite(self.mean):
            return "n/a"
        if self.n == 1:
            return f"{_f(self.mean)} (1 seed: no interval)"
        return (f"{_f(self.mean)} [95% CI {_f(self.low)}, {_f(self.high)}; n={self.n} seeds; "
                f"detectable ±{_f(self.detectable)}]")

    def above(self, x: float) -> bool:
        """The whole interval lies above x."""
        return self.n >= 2 and self.low > x

    def below(self, x: float) -> bool:
        """The whole interval lies below x."""
        return self.n >= 2 and self.high < x


def _f(x: float) -> str:
    """3 significant digits."""
    return "nan" if not math.isfinite(x) else (f"{x:.2e}" if x and abs(x) < 1e-3 else f"{x:.3g}")


def mean_interval(values: Sequence[float]) -> Interval:
    """The 95% t interval of the mean of the finite values (infinite width for one value)."""
    x = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan)
    if n == 1:
        return Interval(float(x[0]), -math.inf, math.inf, 1, math.inf)
    se = float(x.std(ddof=1)) / math.sqrt(n)
    half = t_quantile(n - 1) * se
    detectable = (t_quantile(n - 1) + t_quantile(n - 1, _T80)) * se
    return Interval(float(x.mean()), float(x.mean() - half), float(x.mean() + half), n,
                    detectable)


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
