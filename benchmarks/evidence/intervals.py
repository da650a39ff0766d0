"""Intervals and tests over seeds: a mean with its 95% t interval, one-sided p-values, Holm's
correction, and a ratio of means with Fieller's interval.

    iv = mean_interval([0.4, 0.7, 0.5])       # Interval(mean, low, high, n, detectable, se)
    iv.above(0), iv.p_above(0)                 # the interval lies above 0; the test's p-value
    holm([0.01, 0.04, 0.03])                   # Holm-adjusted p-values, same order
    ratio_interval(gains_a, gains_b)           # mean(a) / mean(b) with Fieller's 95% interval

The detectable effect is the true mean a two-sided test at `alpha` would find 80% of the time
with that spread and that many values: (t_{1-alpha/2} + t_0.8) · sd / √n. One value gives no
interval. Student's t comes from scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

ALPHA, POWER = 0.05, 0.8


def t_quantile(df: int, q: float = 1 - ALPHA / 2) -> float:
    """Student's t quantile q with df degrees of freedom (inf below df 1)."""
    return float(_st.t.ppf(q, df)) if df >= 1 else math.inf


def detectable_effect(sd: float, n: int, alpha: float = ALPHA) -> float:
    """The true mean a two-sided test at `alpha` finds with 80% power: (t + t_0.8)·sd/√n."""
    if n < 2 or not math.isfinite(sd):
        return math.inf
    return (t_quantile(n - 1, 1 - alpha / 2) + t_quantile(n - 1, POWER)) * sd / math.sqrt(n)


@dataclass(frozen=True)
class Interval:
    """A mean over n seeds with its 95% interval and the smallest effect it could detect."""

    mean: float
    low: float
    high: float
    n: int
    detectable: float
    se: float = math.nan
    df: float | None = None  # the t distribution's degrees of freedom (None: n - 1)

    @property
    def dof(self) -> float:
        """The degrees of freedom of its t tests: `df`, or n - 1 over n seeds."""
        return self.n - 1 if self.df is None else self.df

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

    def within(self, lo: float, hi: float) -> bool:
        """The whole interval lies inside (lo, hi)."""
        return self.n >= 2 and lo < self.low and self.high < hi

    def p_above(self, x: float) -> float:
        """One-sided t-test p-value of "the mean is above x" (1 when it cannot be tested)."""
        if self.n < 2 or not math.isfinite(self.mean):
            return 1.0
        if not self.se > 0:
            return 0.0 if self.mean > x else 1.0
        return float(_st.t.sf((self.mean - x) / self.se, self.dof))

    def p_below(self, x: float) -> float:
        """One-sided t-test p-value of "the mean is below x"."""
        if self.n < 2 or not math.isfinite(self.mean):
            return 1.0
        if not self.se > 0:
            return 0.0 if self.mean < x else 1.0
        return float(_st.t.cdf((self.mean - x) / self.se, self.dof))


def _f(x: float) -> str:
    """3 significant digits."""
    return "nan" if not math.isfinite(x) else (f"{x:.2e}" if x and abs(x) < 1e-3 else f"{x:.3g}")


def finite(values: Sequence[float]) -> np.ndarray:
    """The finite values as a float array (None and NaN dropped)."""
    return np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)


def mean_interval(values: Sequence[float]) -> Interval:
    """The 95% t interval of the mean of the finite values (infinite width for one value)."""
    x = finite(values)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan)
    if n == 1:
        return Interval(float(x[0]), -math.inf, math.inf, 1, math.inf)
    sd = float(x.std(ddof=1))
    se = sd / math.sqrt(n)
    half = t_quantile(n - 1) * se
    return Interval(float(x.mean()), float(x.mean() - half), float(x.mean() + half), n,
                    detectable_effect(sd, n), se)


def welch_interval(a: Sequence[float], b: Sequence[float]) -> Interval:
    """mean(a) - mean(b) of two independent samples with Welch's 95% interval (its degrees of
    freedom by Welch-Satterthwaite; n: the smaller sample)."""
    xa, xb = finite(a), finite(b)
    n = min(len(xa), len(xb))
    if n < 2:
        return Interval(math.nan, math.nan, math.nan, n, math.nan)
    va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(xa) - 1) + vb ** 2 / (len(xb) - 1)) if se > 0 \
        else float(n - 1)
    mean, half = float(xa.mean() - xb.mean()), float(_st.t.ppf(1 - ALPHA / 2, df)) * se
    detectable = (float(_st.t.ppf(1 - ALPHA / 2, df)) + float(_st.t.ppf(POWER, df))) * se
    return Interval(mean, mean - half, mean + half, n, detectable, se, df)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given (family-wise error control)."""
    p = np.asarray(pvalues, dtype=np.float64)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return [float(a) for a in adjusted]


@dataclass(frozen=True)
class Ratio:
    """mean(a) / mean(b) over n paired seeds with Fieller's 95% interval.

    `bounded` is False when the denominator's own interval contains 0: the ratio is then
    undefined (the interval is the whole line or its complement), and `low`, `high` are ±inf.
    """

    value: float
    low: float
    high: float
    n: int
    bounded: bool

    def __str__(self) -> str:
        if self.n < 2 or not math.isfinite(self.value):
            return "n/a" if self.n < 2 else "undefined (the denominator is 0)"
        if not self.bounded:
            return f"{_f(self.value)} [95% CI unbounded: the denominator's interval contains 0]"
        return f"{_f(self.value)} [95% CI {_f(self.low)}, {_f(self.high)}; n={self.n} seeds]"


def ratio_interval(a: Sequence[float], b: Sequence[float]) -> Ratio:
    """Fieller's 95% interval of mean(a) / mean(b) for per-seed pairs (a_i, b_i); pairs with a
    non-finite member are dropped as pairs."""
    pairs = [(x, y) for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)]
    n = len(pairs)
    if n == 0:
        return Ratio(math.nan, math.nan, math.nan, 0, False)
    x, y = np.array(pairs).T
    mx, my = float(x.mean()), float(y.mean())
    value = mx / my if my else math.nan
    if n < 2:
        return Ratio(value, -math.inf, math.inf, n, False)
    cov = np.cov(x, y, ddof=1) / n  # variances and covariance of the two means
    t2 = t_quantile(n - 1) ** 2
    qa, qb, qc = my * my - t2 * cov[1, 1], mx * my - t2 * cov[0, 1], mx * mx - t2 * cov[0, 0]
    if qa <= 0:  # the denominator is not clear of 0 at 95%
        return Ratio(value, -math.inf, math.inf, n, False)
    root = math.sqrt(max(qb * qb - qa * qc, 0.0))
    return Ratio(value, (qb - root) / qa, (qb + root) / qa, n, True)
