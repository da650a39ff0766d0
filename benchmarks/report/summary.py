"""The report's opening: the line that says what came out, every verdict in one table, the
methods ranked per task, and the reasons several claims share, said once."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from benchmarks.evidence.intervals import Interval, mean_interval
from benchmarks.evidence.records import RunData, mean_std
from benchmarks.evidence.verdicts import CONTRADICTED, INCONCLUSIVE, SUPPORTED


def at_a_glance(data: RunData, claims, plots: dict[str, list[str]]) -> list[str]:
    """The report's opening: every verdict in one table, then the methods ranked per task
    (with the ranking figure)."""
    out = ["## At a glance", "", "| claim | task | verdict | Holm-adjusted p |",
           "|---|---|---|---|"]
    for c in claims:
        name, _, task = c.name.partition(" [")
        p = f"{c.p:.3g}" if c.tested else "– (not tested)"
        out.append(f"| {name} | {task.rstrip(']') or '–'} | {c.status} | {p} |")
    out.append("")
    for task in data.tasks():
        ranked = ranking_table(data, task)
        if ranked:
            out += [f"**Methods ranked by mean alone gain over the base [{task}]** (mean over "
                    f"seeds with its 95% t interval; exploratory, not corrected for the "
                    f"number of methods):", "", *ranked, ""]
            out += [f"![ranking](<{p}>)" for p in plots.get(f"{task}|ranking", [])]
            out.append("")
    return out


def ranked_methods(data: RunData, task: str) -> list[tuple[Interval, str, list]]:
    """(mean alone gain over the base with its t interval, method, its trajectories) for the
    methods of a task (its own kl_coef) with two points or more, best first."""
    rows = []
    for method in data.methods(task, None):
        trajs = [t for t in data.trajectories(task, method, None).values()
                 if len(t.iterations) > 1]
        if trajs:
            rows.append((mean_interval([t.mean_gain() for t in trajs]), method, trajs))
    return sorted(rows, key=lambda r: -r[0].mean)


def ranking_table(data: RunData, task: str) -> list[str]:
    """The methods of a task by mean alone gain over the base, best first, with their final
    alone ΣKL and seeds."""
    rows = ranked_methods(data, task)
    if len(rows) < 2:
        return []
    lines = ["| rank | method | mean alone gain [95% CI] | final alone Σ KL (nats) | seeds |",
             "|---|---|---|---|---|"]
    return lines + [f"| {i} | {m} | {gain} | {mean_std([t.kl[-1] for t in trajs])} | "
                    f"{len(trajs)} |" for i, (gain, m, trajs) in enumerate(rows, 1)]


def shared_reasons(claims) -> tuple[list[str], list]:
    """Reasons that several claims give word for word (a method's learning gate, say), said once
    above the claims and cited in each by number; returns (those lines, the claims citing)."""
    parts = [[p for p in c.reason.split("; ") if p] for c in claims]
    counts: dict[str, int] = {}
    for ps in parts:
        for p in set(ps):
            counts[p] = counts.get(p, 0) + 1
    common = [p for p in dict.fromkeys(p for ps in parts for p in ps) if counts[p] > 1]
    if not common:
        return [], list(claims)
    number = {p: i for i, p in enumerate(common, 1)}
    lines = ["Reasons several claims share, said once:", "",
             *[f"{i}. {p}." for p, i in number.items()], ""]
    said = [replace(c, reason="; ".join(f"reason {number[p]} above" if p in number else p
                                        for p in ps)) for c, ps in zip(claims, parts)]
    return lines, said


def headline(data: RunData, claims) -> str:
    """What came out, in one line: the verdicts' count and each method's mean alone gain."""
    count = {s: sum(c.status == s for c in claims) for s in (SUPPORTED, CONTRADICTED,
                                                               INCONCLUSIVE)}
    gains = []
    for task in data.tasks():
        for method in data.methods(task, None):
            gain = [t.mean_gain() for t in data.trajectories(task, method, None).values()
                    if len(t.iterations) > 1]
            if gain:
                gains.append(f"{method} {np.mean(gain):+.3g}")
    seeds = n_seeds(data)
    learned = (f"; mean alone reward gained over the base ({seeds} seed"
               f"{'s' if seeds > 1 else ''}): " + ", ".join(gains)) if gains else ""
    return (f"**In one line:** {count[SUPPORTED]} of the paper's claims supported, "
            f"{count[CONTRADICTED]} contradicted, {count[INCONCLUSIVE]} inconclusive on this "
            f"model{learned}.")


def n_seeds(data: RunData) -> int:
    """How many seeds the run's records hold (its settings' count when it has none yet)."""
    seeds = {r["seed"] for r in data.rows} | {r["seed"] for r in data.evals}
    return len(seeds) or len(data.config.get("seeds", [])) or 1
