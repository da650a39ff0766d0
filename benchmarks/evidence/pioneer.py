"""Each model read against its own pioneer iterations: how many training iterations it answered
first before an alone point. With role exchange a CORY model is pioneer half of the time, so
at iteration t it has answered first in about t/2 iterations while PPO's model has in t. This
compares each model's alone reward with PPO's *at the same number of pioneer iterations*
(PPO's curve interpolated linearly between its points), beside the usual reading at the same
iteration, on the same points and seeds. Exploratory, like the frontier tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.learners.registry import resolve_method
from benchmarks.evidence.intervals import Interval, mean_interval
from benchmarks.evidence.records import RunData, position_of, select


def pioneer_counts(rows: list[dict], iterations) -> list[int]:
    """For each of `iterations`: how many of the model's training `rows` (one per iteration)
    before it put the model first in the chain."""
    first = sorted({r["iteration"] for r in rows if position_of(r) == 0})
    return [int(np.searchsorted(first, it)) for it in iterations]


@dataclass
class PioneerReading:
    """A method against PPO at matched pioneer iterations and at matched iterations."""

    at_pioneer: Interval  # reward − PPO's at the model's own pioneer-iteration count
    at_iteration: Interval  # reward − PPO's at the same iteration (the same points)
    span: tuple[int, int]  # the pioneer counts read (smallest, largest)
    points: int  # alone points read per seed (over the method's models)


def read(data: RunData, task: str, kl_coef, method: str) -> PioneerReading | None:
    """Per seed shared with PPO, the mean over the method's models and its alone points after
    the base (up to PPO's last iteration in pioneer iterations) of its reward minus PPO's;
    None when its every model answered first in every iteration (a single model, or one policy
    in every position: the two readings are the same)."""
    ppo = data.trajectories(task, "ppo", kl_coef)
    one_policy = _one_policy(method)
    at_pioneer, at_iteration, counts, points, partial = [], [], [], [], False
    for seed, base in sorted(ppo.items()):
        gaps_p, gaps_i = [], []
        for model in data.alone_agents(task, method, kl_coef):
            curve = data.trajectories(task, method, kl_coef, model).get(seed)
            if curve is None:
                continue
            rows = select(data.rows, task=task, method=method, swept_kl_coef=kl_coef, seed=seed,
                          **({} if one_policy else {"agent": model}))
            for it, reward, n in zip(curve.iterations, curve.reward,
                                     pioneer_counts(rows, curve.iterations)):
                if 0 < it and n <= base.iterations[-1]:
                    partial |= n < it
                    gaps_p.append(reward - np.interp(n, base.iterations, base.reward))
                    gaps_i.append(reward - np.interp(it, base.iterations, base.reward))
                    counts.append(n)
        if gaps_p:
            at_pioneer.append(float(np.mean(gaps_p)))
            at_iteration.append(float(np.mean(gaps_i)))
            points.append(len(gaps_p))
    if not partial:
        return None
    return PioneerReading(mean_interval(at_pioneer), mean_interval(at_iteration),
                          (min(counts), max(counts)), min(points))


def _one_policy(method: str) -> bool:
    """Whether the method's agents are one policy (its every iteration is a pioneer one)."""
    try:
        return resolve_method(method).structure.shared_policy
    except ValueError:  # a plug-in's method whose module this process did not import
        return False


def pioneer_table(data: RunData, task: str, kl_coef) -> list[str]:
    """Every method with role exchange against PPO at matched pioneer iterations."""
    if not data.trajectories(task, "ppo", kl_coef):
        return []
    lines = ["| method | reward − PPO's at the same pioneer iterations | reward − PPO's at the "
             "same iteration | pioneer iterations read | points per seed |",
             "|---|---|---|---|---|"]
    for method in data.methods(task, kl_coef):
        reading = None if method == "ppo" else read(data, task, kl_coef, method)
        if reading is not None:
            lo, hi = reading.span
            lines.append(f"| {method} | {reading.at_pioneer} | {reading.at_iteration} | "
                         f"{lo}–{hi} | {reading.points} |")
    return lines if len(lines) > 2 else []
