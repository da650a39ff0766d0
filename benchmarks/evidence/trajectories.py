"""What a claim reads: the compared methods' trajectories on the seeds they share, the seeds
left out and why, and the learning gate (`benchmarks.evidence.claims` states the rules)."""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.evidence.intervals import Interval, mean_interval
from benchmarks.evidence.records import RunData, Trajectory

MIN_SEEDS, MIN_POINTS = 3, 5
MEANINGFUL = 0.10  # a reward change or gap within ±10% of the task's reward scale is negligible


@dataclass
class Inputs:
    """The smoothed trajectories of the compared methods on the seeds they share."""

    trajectories: dict[str, dict[int, Trajectory]]
    seeds: list[int]
    scale: float  # the compared methods' reward scale (MEANINGFUL of it is negligible)
    problem: str = ""  # why no verdict can be given, if so
    gains: dict[str, Interval] = field(default_factory=dict)  # mean gain over the base (gate)
    best: dict[str, Interval] = field(default_factory=dict)  # best smoothed gain (descriptive)
    raw: dict[str, dict[int, Trajectory]] = field(default_factory=dict)
    left_out: str = ""  # the seeds left out and why

    def per_seed(self, method: str) -> list[Trajectory]:
        """The method's smoothed trajectories in seed order (trends, final points)."""
        return [self.trajectories[method][s] for s in self.seeds]

    def points(self, method: str) -> list[Trajectory]:
        """The method's raw points in seed order (frontiers: smoothing neighbours along a
        convex frontier moves them off it, the more so for a method that moves faster)."""
        return [self.raw[method][s] for s in self.seeds]

    @property
    def delta(self) -> float:
        """The negligible band's half-width δ."""
        return MEANINGFUL * self.scale


def left_out(data: RunData, task: str, kl_coef, methods: list[str], seeds: list[int]) -> str:
    """The seeds some compared method has records of but that are not used, and why."""
    every = {m: data.trajectories(task, m, kl_coef, complete=False) for m in methods}
    full = {m: max((len(t.iterations) for t in every[m].values()), default=0) for m in methods}
    why = {}
    for s in sorted(set().union(*every.values()) - set(seeds)):
        why[s] = ", ".join(f"no {m} records" if s not in every[m] else
                           f"{m} has {len(every[m][s].iterations)} of {full[m]} evaluation points"
                           for m in methods
                           if s not in every[m] or len(every[m][s].iterations) < full[m])
    return "; ".join(f"seed {s} left out ({w})" for s, w in why.items())


def learning_gate(method: str, gain: Interval, per_seed: list[float], delta: float) -> str:
    """Why a method's learning is not shown ("" when its mean gain's interval is above 0)."""
    if gain.above(0):
        return ""
    if gain.below(0):
        return f"{method} did not learn: its mean alone reward over the base is {gain}, below 0"
    if gain.within(-delta, delta):
        return (f"{method} did not learn measurably: its mean alone reward over the base is "
                f"{gain}, within ±{delta:.3g}")
    seeds = ", ".join(f"{g:+.3g}" for g in per_seed)
    return (f"{method}'s learning is not shown at {gain.n} seeds (which does not say it did not "
            f"learn): its mean alone reward over the base is {gain}, per seed {seeds}")


def gather(data: RunData, task: str, kl_coef, methods: list[str]) -> Inputs:
    """The claim inputs, with `problem` set when a verdict cannot be given."""
    raw = {m: data.trajectories(task, m, kl_coef) for m in methods}  # every point only
    seeds = sorted(set.intersection(*(set(t) for t in raw.values()))) if raw else []
    trajs = {m: {s: t[s].smoothed() for s in seeds} for m, t in raw.items()}
    out = Inputs(trajs, seeds, data.alone_reward_scale(task, methods),
                 raw={m: {s: t[s] for s in seeds} for m, t in raw.items()},
                 left_out=left_out(data, task, kl_coef, methods, seeds))
    problems = []
    if len(seeds) < MIN_SEEDS:
        problems.append(f"too few seeds: {len(seeds)} < {MIN_SEEDS}")
    points = min((len(raw[m][s].iterations) for m in raw for s in seeds), default=0)
    if points < MIN_POINTS:
        problems.append(f"too few evaluation points: {points} < {MIN_POINTS}")
    for m in methods:  # the mean over the points after the base, minus the base's own point
        per_seed = [raw[m][s].mean_gain() for s in seeds]
        out.gains[m] = mean_interval(per_seed)
        out.best[m] = mean_interval([trajs[m][s].reward.max() - raw[m][s].reward[0]
                                     for s in seeds])
        if len(seeds) >= 2 and (why := learning_gate(m, out.gains[m], per_seed, out.delta)):
            problems.append(why)
    out.problem = "; ".join(problems)
    return out


def missing_methods(data: RunData, task: str, kl_coef, methods) -> list[str]:
    """Methods without alone-evaluation records on this task."""
    return [m for m in methods if not data.trajectories(task, m, kl_coef)]
