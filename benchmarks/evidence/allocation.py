"""Where a study's CPU time should go: the variance components of a paired contrast's alone gain
and the interval width each allocation of seeds, evaluation points and openings buys per
CPU-hour.

For a paired contrast a − b on seed s, the alone gain difference is D_s = mean over the P
points after the base of d_{s,p} = r_a(s, p) − r_b(s, p) (the base model's point is the same
evaluation in both arms, so it cancels). Its spread over seeds has three sources:

- seeds: σ²_seed, how far one seed's run lands from another's;
- points: σ²_point, how much one evaluation point strays from its seed's level beyond what its
  openings explain (the run's own wobble from point to point);
- openings: σ²_open(Q) = SE² of a point over its Q held-out openings, read from the records'
  `task_reward_se` (scaled as 1/Q).

so that Var(D_s) = σ²_seed + (σ²_point + σ²_open(Q)) / P. From d_{s,p} = μ_p + a_s + ε_{s,p}
(two-way, additive): Var(ε) = σ²_point + σ²_open, σ²_seed = Var(a_s) − Var(ε) / P. The 95%
interval of the mean over S seeds is ± t(S − 1) √(Var(D) / S); its cost is S × (every arm's
training + (P + 1) × its models × Q/256 × the seconds of one 256-opening evaluation).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from benchmarks.evidence.intervals import t_quantile
from benchmarks.evidence.records import RunData, select


@dataclass
class Components:
    """A paired contrast's variance components at the records' own allocation."""

    seeds: int
    points: int  # after the base
    openings: int
    seed: float  # σ²_seed
    point: float  # σ²_point
    opening: float  # σ²_open at `openings`
    gains: list[float]  # D_s per seed

    def variance(self, points: int, openings: int) -> float:
        """Var(D_s) at another number of points and openings."""
        return self.seed + (self.point + self.opening * self.openings / openings) / points

    def width(self, seeds: int, points: int, openings: int) -> float:
        """The 95% interval's full width of the mean gain difference."""
        return 2 * t_quantile(seeds - 1) * math.sqrt(self.variance(points, openings) / seeds)


def arm_points(data: RunData, task: str, method: str) -> dict[int, dict[int, tuple]]:
    """seed -> iteration -> (mean reward over the method's models, its SE² over openings)."""
    out: dict[int, dict[int, tuple]] = {}
    for r in select(data.evals, task=task, method=method, swept_kl_coef=None):
        out.setdefault(int(r["seed"]), {}).setdefault(int(r["iteration"]), []).append(r)
    return {s: {it: (float(np.mean([r["task_reward"] for r in rs])),
                     float(np.mean([r.get("task_reward_se", 0.0) ** 2 for r in rs])) / len(rs))
                for it, rs in pts.items()} for s, pts in out.items()}


def components(data: RunData, task: str, a: str, b: str) -> Components:
    """The variance components of a − b's alone gain, over the seeds and points both have."""
    pa, pb = arm_points(data, task, a), arm_points(data, task, b)
    seeds = sorted(set(pa) & set(pb))
    its = sorted(set.intersection(*(set(pa[s]) & set(pb[s]) for s in seeds)))[1:]  # no base
    if len(seeds) < 3 or len(its) < 2:
        raise ValueError(f"{a} − {b} on {task}: {len(seeds)} shared seeds and {len(its)} points "
                         f"after the base; the components need 3 and 2")
    d = np.array([[pa[s][i][0] - pb[s][i][0] for i in its] for s in seeds])
    se2 = np.array([[pa[s][i][1] + pb[s][i][1] for i in its] for s in seeds])
    resid = d - d.mean(1, keepdims=True) - d.mean(0, keepdims=True) + d.mean()
    eps = float((resid ** 2).sum() / ((len(seeds) - 1) * (len(its) - 1)))
    opening = float(se2.mean())
    seed = float(d.mean(1).var(ddof=1)) - eps / len(its)
    n = int(np.median([r["n_queries"] for r in select(data.evals, task=task, method=a)]))
    return Components(len(seeds), len(its), n, max(seed, 0.0), max(eps - opening, 0.0),
                      opening, [float(x) for x in d.mean(1)])


def train_seconds(data: RunData, task: str, method: str) -> float:
    """A run's training seconds per iteration (the median over its records of rollout plus
    update; a multi-model method's records repeat the iteration's time)."""
    times = [r.get("time_rollout_s", 0.0) + r.get("time_update_s", 0.0)
             for r in select(data.rows, task=task, method=method)]
    return float(np.median(times)) if times else math.nan


LOG_LINE = re.compile(r"^(\S+ \S+) (\S+)(?::| it | alone)")


def eval_seconds(folder: str | Path, data: RunData, task: str) -> float:
    """Seconds of one model's alone evaluation of 256 openings, as the study ran it: in its
    log, the time from a run's line before an evaluation point to that point's line, per model
    it evaluated, scaled to 256 openings (the median over every point after the base)."""
    last: dict[str, datetime] = {}
    gaps = []
    n = np.median([r["n_queries"] for r in select(data.evals, task=task)])
    for line in (Path(folder) / "log.txt").read_text().splitlines():
        m = LOG_LINE.match(line)
        if not m or not m[2].startswith(f"{task}-"):
            continue
        when = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S")
        run = m[2].rstrip(":")
        if " alone at iteration " in line and not line.endswith(" 0: ") and run in last \
                and " alone at iteration 0:" not in line:
            gaps.append((when - last[run]).total_seconds() / max(1, line.count(" llm_")))
        last[run] = when
    return float(np.median(gaps)) * 256 / n if gaps else math.nan


def models_of(data: RunData, task: str, method: str) -> int:
    """How many models of the method answer alone at each point."""
    return len(data.alone_agents(task, method, None)) or 1


def cost_hours(data: RunData, task: str, arms: tuple[str, str], seeds: int, iterations: int,
               points: int, openings: int, eval_256: float) -> float:
    """CPU-hours (one core-second per second of a one-thread run) of a contrast's runs."""
    total = 0.0
    for m in arms:
        run = iterations * train_seconds(data, task, m) + \
            (points + 1) * models_of(data, task, m) * openings / 256 * eval_256
        total += seeds * run
    return total / 3600


def allocations(today: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """The allocations a study can choose around today's (seeds, points, openings): 3 seeds
    to twice today's, 3 points to today's, a quarter of today's openings to all of them."""
    s0, p0, q0 = today
    return sorted({(s, p, q) for s in range(3, 2 * s0 + 1)
                   for p in {3, 5, 10, p0} if p <= p0
                   for q in {q0, max(1, q0 // 2), max(1, q0 // 4)}})


def allocation_table(data: RunData, task: str, a: str, b: str, iterations: int,
                     eval_256: float, today: tuple[int, int, int]) -> tuple[list[str], tuple]:
    """The markdown table of the cheapest allocations (seeds, points, openings) no wider than
    today's, cheapest first, with today's; and the cheapest one."""
    c = components(data, task, a, b)
    base_w = c.width(*today)
    base_h = cost_hours(data, task, (a, b), today[0], iterations, today[1], today[2], eval_256)
    rows = []
    for s, p, q in allocations(today):
        w = c.width(s, p, q)
        h = cost_hours(data, task, (a, b), s, iterations, p, q, eval_256)
        rows.append((h, w, s, p, q))
    fits = sorted(r for r in rows if r[1] <= base_w * 1.0001)
    shown = fits[:5] + [r for r in fits[5:] if r[2:] == today]
    lines = ["| seeds | points | openings | 95% width | CPU-hours | vs today |",
             "|---|---|---|---|---|---|"]
    for h, w, s, p, q in shown:
        mark = " (today)" if (s, p, q) == today else ""
        lines.append(f"| {s} | {p} | {q} | {w:.3f} | {h:.2f} | {h / base_h:.2f}× the hours"
                     f"{mark} |")
    return lines, (float(fits[0][0]), *fits[0][1:])
