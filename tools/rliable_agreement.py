"""The leaderboard's aggregates (benchmarks/evidence/aggregates.py, SciPy's bootstrap) against
rliable's on the same scores: points, 95% intervals, and time.

rliable is not a dependency of cory; run this in an environment that has it:

    python3.11 -m venv /tmp/rliable && /tmp/rliable/bin/pip install rliable "pandas<3"
    /tmp/rliable/bin/python tools/rliable_agreement.py

The aggregates module is loaded from its file, so nothing else of cory (torch, ...) is needed.
rliable needs the same number of runs on every task (a runs x tasks array), so the scores here
are 8 seeds on each of 2 tasks; the intervals differ by the bootstrap's Monte Carlo error only.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[1] / "benchmarks" / "evidence" / "aggregates.py"
TAUS = np.round(np.linspace(-1.0, 3.0, 41), 2)
REPS = 2000


def ours():
    """benchmarks.evidence.aggregates, loaded from its file."""
    spec = importlib.util.spec_from_file_location("aggregates", HERE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(f):
    """(f(), seconds)."""
    start = time.perf_counter()
    out = f()
    return out, time.perf_counter() - start


def main() -> None:
    """Print each statistic's point and interval by both, their gaps and times."""
    from rliable import library as rly
    from rliable import metrics

    agg = ours()
    rng = np.random.default_rng(0)
    x = rng.normal([1.0, 0.6], [0.5, 0.3], size=(8, 2))  # runs x tasks, normalized scores
    y = rng.normal([0.8, 0.7], [0.4, 0.3], size=(8, 2))
    tasks = ("reviews", "reasoning")
    sx = {t: x[:, i] for i, t in enumerate(tasks)}
    sy = {t: y[:, i] for i, t in enumerate(tasks)}
    rows = []

    (pts, cis), t_r = timed(lambda: rly.get_interval_estimates(
        {"x": x}, lambda s: np.array([metrics.aggregate_iqm(s), metrics.aggregate_mean(s)]),
        reps=REPS))
    (iqm, mean), t_o = timed(lambda: (agg.aggregate(sx, agg.IQM), agg.aggregate(sx, agg.MEAN)))
    for k, name in enumerate(("IQM", "mean")):
        mine = (iqm, mean)[k]
        rows.append((name, (pts["x"][k], *cis["x"][:, k]), mine, t_r / 2, t_o / 2))

    (pts, cis), t_r = timed(lambda: rly.get_interval_estimates(
        {"x,y": (x, y)}, metrics.probability_of_improvement, reps=REPS))
    mine, t_o = timed(lambda: agg.probability_of_improvement(sx, sy))
    rows.append(("P(x > y)", (float(np.squeeze(pts["x,y"])), *np.ravel(cis["x,y"])), mine, t_r,
                 t_o))

    (dist, cis), t_r = timed(lambda: rly.create_performance_profile({"x": x}, TAUS, reps=REPS))
    mine, t_o = timed(lambda: agg.performance_profile(sx, TAUS))
    point_gap = max(abs(dist["x"][i] - m[0]) for i, m in enumerate(mine))
    gap = max(max(abs(cis["x"][0][i] - m[1]), abs(cis["x"][1][i] - m[2]))
              for i, m in enumerate(mine))
    print(f"{'statistic':<22}{'rliable [95%]':<28}{'cory [95%]':<28}{'largest gap':<13}"
          f"{'rliable s':<11}cory s")
    for name, (p, lo, hi), (q, lo2, hi2), tr, to in rows:
        print(f"{name:<22}{p:.4f} [{lo:.4f}, {hi:.4f}]{'':<5}{q:.4f} [{lo2:.4f}, {hi2:.4f}]"
              f"{'':<5}{max(abs(p - q), abs(lo - lo2), abs(hi - hi2)):<13.4f}{tr:<11.3f}{to:.3f}")
    print(f"{'profile (41 taus)':<22}{'':<28}{'':<28}{gap:<13.4f}{t_r:<11.3f}{t_o:.3f}")
    print(f"profile points' largest gap {point_gap:.4f}; its bounds move in steps of 1/16 "
          f"(8 runs on each of 2 tasks)")


if __name__ == "__main__":
    main()
