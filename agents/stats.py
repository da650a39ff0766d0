"""Intervals over seeds: a mean with its 95% Student-t interval and the effect it can detect.

    iv = mean_interval([0.4, 0.7, 0.5])      # Interval(mean, low, high, n, detectable)
    iv.above(0)                               # the whole interval lies above 0

The detectable effect is the true mean a two-sided test at 5% would find 80% of the time with
that spread and that many values: (t_0.975 + t_0.8) · sd / √n. One value gives no interval.
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


