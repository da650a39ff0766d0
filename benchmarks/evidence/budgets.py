"""What each arm spent: the budgets two arms must share unless they are the factor under test.

Per method (an arm), from its records, per model and averaged over seeds: iterations, episodes,
generated tokens, optimizer steps, the rows (one answer each) an optimizer step averages over,
and how many of the model's turns it trained in the alone role (the alone prompt: the first
position, or any position without knowledge transfer) and in each position. `budget_table` is
the report's table; `differing` names the budgets in which two arms differ by more than 5%,
which `benchmarks.why` flags on a contrast.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Set

import numpy as np

from agents.learners.registry import resolve_method
from benchmarks.evidence.records import RunData, ordered, select

BUDGETS = ("iterations", "episodes", "generated tokens", "optimizer steps",
           "rows per optimizer step", "alone-role turns")
TOLERANCE = 0.05  # budgets within 5% count as matched


def arm_budget(data: RunData, task: str, method: str, kl_coef=None,
               seeds: Set[int] | None = None, iterations: int | None = None) -> dict[str, float]:
    """An arm's budgets per model, averaged over its seeds (only `seeds` and the first
    `iterations` iterations, when given; empty when it has no records)."""
    rows = [r for r in select(data.rows, task=task, method=method, swept_kl_coef=kl_coef)
            if (seeds is None or int(r["seed"]) in seeds)
            and (iterations is None or int(r["iteration"]) < iterations)]
    if not rows:
        return {}
    m = resolve_method(method)
    shared, kt = m.structure.shared_policy, m.structure.knowledge_transfer
    batch = int(data.config.get("train", {}).get("batch_size", 0)) * m.learner.batch_multiplier
    per_seed = []
    for seed in ordered(r["seed"] for r in rows):
        mine = select(rows, seed=seed)
        models = 1 if shared else len(ordered(r["agent"] for r in mine))
        turns: dict[str, float] = defaultdict(float)
        for r in mine:
            pos = int(r.get("position", 0))
            turns[f"position {pos} turns"] += 1 / models
            turns["alone-role turns"] += (pos == 0 or not kt) / models
        its = len(ordered(r["iteration"] for r in mine))
        steps = {r["agent"]: 0.0 for r in mine}
        for r in mine:
            steps[r["agent"]] += r.get("optimizer_steps", 0)
        optimizer = max(steps.values()) if shared else sum(steps.values()) / models
        rows_trained = len(mine) * batch / models  # a record is one agent's turn of a batch
        per_seed.append({
            "iterations": its, "episodes": its * batch,
            "generated tokens": sum(r.get("response_length", 0) for r in mine) * batch / models,
            "optimizer steps": optimizer,
            "rows per optimizer step": rows_trained / optimizer if optimizer else 0.0, **turns})
    keys = ordered(k for s in per_seed for k in s)
    return {k: float(np.mean([s.get(k, 0.0) for s in per_seed])) for k in keys}


def differing(a: dict[str, float], b: dict[str, float], skip: tuple[str, ...] = ()) -> list[str]:
    """The budgets (of BUDGETS, less `skip`) in which two arms differ by more than 5%."""
    out = []
    for k in BUDGETS:
        if k in skip or k not in a or k not in b:
            continue
        if abs(a[k] - b[k]) > TOLERANCE * max(abs(a[k]), abs(b[k]), 1e-12):
            out.append(f"{k} {a[k]:.4g} vs {b[k]:.4g}")
    return out


def budget_table(data: RunData, task: str, kl_coef=None) -> list[str]:
    """Every arm's budgets per model (means over seeds) as a markdown table."""
    arms = {m: arm_budget(data, task, m, kl_coef) for m in data.methods(task, kl_coef)}
    arms = {m: b for m, b in arms.items() if b}
    if not arms:
        return []
    positions = sorted({k for b in arms.values() for k in b if k.startswith("position")})
    cols = [*BUDGETS, *positions]
    lines = ["| method | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for m, b in arms.items():
        lines.append(f"| {m} | " + " | ".join(f"{b.get(c, 0):.4g}" for c in cols) + " |")
    return lines
