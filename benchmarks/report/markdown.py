"""Turn a benchmark study folder into tables, claim checks and a markdown report (the plots are
`benchmarks.report.plots`).

It reads only the folder's records (`records.py`) and never touches a model, so it is fast,
testable on synthetic numbers, and usable on its own:

    python -m benchmarks.report runs/2026-01-01_12-00-00    # (re)write report.md and plots
"""

from __future__ import annotations

import math
import os
from dataclasses import MISSING
from pathlib import Path

import numpy as np

from benchmarks.evidence.budgets import budget_table
from benchmarks.evidence.claims import all_claims
from benchmarks.evidence.frontier import (
    levels_text,
    matched_kl_ratio,
    matched_reward_gap,
    ratio_text,
)
from benchmarks.evidence.pioneer import pioneer_table
from benchmarks.evidence.records import (
    RunData,
    curves,
    final_value,
    mean_std,
    no_records,
    ordered,
    select,
)
from benchmarks.evidence.trajectories import gather
from benchmarks.evidence.transfer import format_transfer
from benchmarks.report.plots import write_plots
from benchmarks.report.summary import at_a_glance, headline, n_seeds, shared_reasons
from benchmarks.settings.config import SETTINGS
from cory_common import cli
from cory_common.files import atomic_write
from cory_common.threads import configure

TABLE_FIELDS = ("task_reward", "kl", "combined_reward", "distinct_1", "distinct_2")


# ------------------------------------------------------------------------------- markdown
def metrics_table(data: RunData, task: str, kl_coef) -> list[str]:
    """One row per method model: final task reward, KL, combined reward, distinct-1/2."""
    labels = {"task_reward": "task reward", "kl": "KL", "combined_reward": "combined reward",
              "distinct_1": "distinct-1", "distinct_2": "distinct-2"}
    lines = ["| method | model | " + " | ".join(labels[f] for f in TABLE_FIELDS) + " |",
             "|---|---|" + "---|" * len(TABLE_FIELDS)]
    for method in data.methods(task, kl_coef):
        rows = [(match.get("agent", "llm_0"), match)
                for _, match in data.series(task, method, kl_coef)]
        if data.two_agent(task, method):
            rows += [(role, {"task": task, "method": method, "swept_kl_coef": kl_coef,
                             "role": role})
                     for role in data.roles(task, method, kl_coef)]
        for model, match in rows:
            cells = [str(data.stat(f, **match)) for f in TABLE_FIELDS]
            lines.append(f"| {method} | {model} | " + " | ".join(cells) + " |")
    return lines


def rounds_table(data: RunData, task: str, kl_coef) -> list[str]:
    """With rounds: per method and role, each round's task reward and KL (final iterations),
    every round of the run's R; a round no episode reached (games that end early) says so."""
    rows = select(data.rows, task=task, swept_kl_coef=kl_coef)
    seen = max((int(k.split("_")[1]) for r in rows for k in r if k.startswith("round_")
                and k.endswith("_kl")), default=0)
    n = max(seen, int(((data.config or {}).get("train") or {}).get("rounds", 1))) if seen else 0
    if not n:
        return []
    lines = ["| method | role | " + " | ".join(f"round {r} reward | round {r} KL"
                                              for r in range(1, n + 1)) + " |",
             "|---|---|" + "---|---|" * n]
    for method in data.methods(task, kl_coef):
        for role in data.roles(task, method, kl_coef):
            match = {"task": task, "method": method, "swept_kl_coef": kl_coef, "role": role}
            cells = [_round_cell(data.stat(f"round_{r}_{f}", **match)) for r in range(1, n + 1)
                     for f in ("task_reward", "kl")]
            lines.append(f"| {method} | {role} | " + " | ".join(cells) + " |")
    return ["### Each round (final iterations)", "", *lines, ""]


def _round_cell(stat) -> str:
    """A round's mean ± std, or "not reached" when no episode got that far."""
    return "not reached" if stat.n == 0 else str(stat)


def rounds_note(config: dict) -> list[str]:
    """What the paper's claims mean on episodes of several rounds (nothing for one)."""
    rounds = (config.get("train") or {}).get("rounds", 1)
    if rounds == 1:
        return []
    return [f"With {rounds} rounds the claims keep their one-round definitions: training's task "
            f"reward is each agent's last round's, its KL the sum over the agent's {rounds} "
            f"turns, and answering alone is one answer to one query (one round); the paper "
            f"made no claim about several rounds.", ""]


def cut_lines(data: RunData, task: str, kl_coef) -> list[str]:
    """Where the window cut prompts (their start dropped to fit): per method and role, the
    mean tokens cut and the share of episodes cut, over every iteration and seed."""
    lines = []
    for method in data.methods(task, kl_coef):
        rows = select(data.rows, task=task, method=method, swept_kl_coef=kl_coef)
        for role in data.roles(task, method, kl_coef):
            cut = [r["prompt_tokens_cut"] for r in rows
                   if r.get("role") == role and r.get("prompt_tokens_cut")]
            if cut:
                rate = np.mean([r.get("prompt_cut_rate", 0.0) for r in rows
                                if r.get("role") == role])
                lines.append(f"- **{method}, {role}**: {np.mean(cut):.3g} prompt tokens cut on "
                             f"average where any were, in {100 * rate:.0f}% of episodes")
    if not lines:
        return []
    return ["### Prompts cut to fit the window", "",
            "The start of these prompts did not fit the context window and was cut (raise "
            "`context_len`):", "", *lines, ""]


def audit_table(data: RunData, task: str, kl_coef) -> list[str]:
    """Multi-agent methods: each position's gain over the previous one and how often it
    copied the previous answer verbatim."""
    lines = []
    for method in data.methods(task, kl_coef):
        if not data.two_agent(task, method):
            continue
        base = {"task": task, "method": method, "swept_kl_coef": kl_coef}
        roles = data.roles(task, method, kl_coef)
        for before, role in zip(roles, roles[1:]):
            gain = {}
            for seed in ordered(r["seed"] for r in select(data.rows, **base)):
                now = curves(data.rows, "task_reward", **base, role=role).get(seed, [])
                prev = curves(data.rows, "task_reward", **base, role=before).get(seed, [])
                n = min(len(now), len(prev))
                gain[seed] = [o - p for o, p in zip(now[:n], prev[:n])]
            final_gain = mean_std([final_value(g, data.window) for g in gain.values()])
            all_gain = mean_std([float(np.mean(g)) for g in gain.values() if g])
            copy_final = data.stat("copy_rate", **base, role=role)
            copy_all = mean_std([float(np.mean(c)) for c in
                                 curves(data.rows, "copy_rate", **base, role=role).values()])
            lines.append(f"| {method} | {role} − {before} | {final_gain} | {all_gain} | "
                         f"{copy_final} | {copy_all} |")
    if not lines:
        return []
    return ["| method | position − previous | reward gain (final) | reward gain (all "
            "iterations) | copy rate of the previous answer (final) | copy rate (all "
            "iterations) |", "|---|---|---|---|---|---|", *lines]


def alone_table(data: RunData, task: str, kl_coef) -> list[str]:
    """Every model answering alone: base and final task reward, ΣKL and combined reward."""
    lines = ["| method | model | task reward | Σ KL (nats) | combined reward | "
             "evaluation points |", "|---|---|---|---|---|---|"]
    by_seed: dict[int, list] = {}  # the base model, once per seed (each method holds a copy)
    for m in data.methods(task, kl_coef):
        for seed, t in data.trajectories(task, m, kl_coef).items():
            by_seed.setdefault(seed, []).append((t.reward[0], t.kl[0], t.combined[0]))
    if not by_seed:
        return []
    first = [np.mean(copies, axis=0) for copies in by_seed.values()]
    lines.append("| base | – | " + " | ".join(str(mean_std([f[i] for f in first]))
                                               for i in range(3)) + " | iteration 0 |")
    for method in data.methods(task, kl_coef):
        for model in data.alone_agents(task, method, kl_coef):
            trajs = data.trajectories(task, method, kl_coef, model).values()
            cells = [str(mean_std([getattr(t, f)[-1] for t in trajs]))
                     for f in ("reward", "kl", "combined")]
            n = min(len(t.iterations) for t in trajs)
            lines.append(f"| {method} | {model} | " + " | ".join(cells) + f" | {n} |")
    return lines


def arms_table(data: RunData, task: str, kl_coef) -> list[str]:
    """Every method against PPO on the frontier: KL at matched reward, reward at matched KL."""
    methods = [m for m in data.methods(task, kl_coef) if data.trajectories(task, m, kl_coef)]
    if "ppo" not in methods or len(methods) < 2:
        return []
    lines = ["| method | KL_PPO / KL_method at matched reward | reward_method − reward_PPO at "
             "matched KL | mean gain over the base (the learning gate) |", "|---|---|---|---|"]
    for m in methods:
        if m == "ppo":
            continue
        inp = gather(data, task, kl_coef, ["ppo", m])
        ratio, levels = matched_kl_ratio(inp.points("ppo"), inp.points(m))
        gap, budgets = matched_reward_gap(inp.points(m), inp.points("ppo"))
        ratio_s = ratio_text(ratio) if ratio.n and math.isfinite(ratio.mean) else \
            f"n/a ({unmatched(inp, 'reward', levels)})"
        gap_s = str(gap) if gap.n and math.isfinite(gap.mean) else \
            f"n/a ({unmatched(inp, 'Σ KL', budgets)})"
        lines.append(f"| {m} | {ratio_s} | {gap_s} | {inp.gains[m]} |")
    return lines


def unmatched(inp, axis: str, levels: list[float]) -> str:
    """Why no matched point exists on `axis`: too few shared seeds, or no range of the axis
    that every seed of both methods reached."""
    if len(inp.seeds) < 2:
        return f"{len(inp.seeds)} seed(s) shared: no interval"
    if not levels:
        return f"no {axis} range that every seed of both methods reached"
    return f"the {axis} levels {levels_text(levels)} give no finite value"


def eval_table(data: RunData, task: str) -> list[str]:
    """Exact-match tasks: pass@1 / pass@k (and greedy) alone, base and final, over seeds."""
    evals = [e for e in select(data.evals, task=task) if "pass@1" in e]
    if not evals:
        return []
    k = evals[0].get("k")
    lines = [f"| method | model | kl_coef | pass@1 | pass@{k} | greedy | problems × samples |",
             "|---|---|---|---|---|---|---|"]
    base = [{f: float(np.mean([e[f] for e in copies if f in e]))
             for f in ("pass@1", "pass@k", "greedy") if any(f in e for e in copies)}
            | {k: copies[0][k] for k in ("n_queries", "n_samples")}
            for copies in (select(evals, iteration=0, seed=s)  # once per seed, not per copy
                           for s in ordered(e["seed"] for e in select(evals, iteration=0)))]
    groups = [("base", "–", None, base)] if base else []
    for method in ordered(e["method"] for e in evals):
        for kl_coef in ordered(e["swept_kl_coef"] for e in select(evals, method=method)):
            for model in ordered(e["agent"] for e in select(evals, method=method,
                                                            swept_kl_coef=kl_coef)):
                group = select(evals, method=method, swept_kl_coef=kl_coef, agent=model, final=True)
                if group:
                    groups.append((method, model, kl_coef, group))
    for method, model, kl_coef, group in groups:
        cells = [str(mean_std([e[f] for e in group if f in e]))
                 for f in ("pass@1", "pass@k", "greedy")]
        size = f"{group[0]['n_queries']} × {group[0]['n_samples']}"
        coef_s = "–" if kl_coef is None else f"{kl_coef:g}"
        lines.append(f"| {method} | {model} | {coef_s} | " + " | ".join(cells) + f" | {size} |")
    return lines


def sample_lines(data: RunData, task: str, kl_coef, per_method: int = 2) -> list[str]:
    """A few responses per method model from the last iteration of its first seed."""
    lines = []
    for method in data.methods(task, kl_coef):
        rows = select(data.rows, task=task, method=method, swept_kl_coef=kl_coef)
        seed = rows[0]["seed"]
        last = max(r["iteration"] for r in select(rows, seed=seed))
        for r in select(rows, seed=seed, iteration=last):
            for text in r.get("samples", [])[:per_method]:
                shown = text.replace("\n", "⏎").replace("`", "'")[:200]
                lines.append(f"- {method} {r['agent']} ({r.get('role', '')}), iteration "
                             f"{last}: `{shown}`")
    return lines


def settings_lines(config: dict) -> list[str]:
    """The run's shared settings as a compact bullet list."""
    keep = ("preset", "quick", "tasks", "methods", "seeds", "iterations", "batch_size",
            "mini_batch_size", "grad_accum_steps", "ppo_epochs", "lr", "lr_by_method",
            "kl_coef", "adaptive_kl", "kl_target", "kl_penalty", "t_rex", "max_new_tokens",
            "repetition_penalty", "model", "kl_coef_sweep", "final_window", "device", "threads")
    out = []
    for name in keep:
        value: object = config
        for key in SETTINGS.get(name, (name,)):
            value = value.get(key, MISSING) if isinstance(value, dict) else MISSING
        if value is not MISSING:
            note = " (the defaults)" if name == "preset" and value == "offline" else ""
            out.append(f"- {name}: `{value}`{note}")
    return out


CONVENTIONS = (
    "**How to read it.** The claims and the main plots use the models *answering alone*: every "
    "`eval_every` iterations each model of each method answers the same held-out queries alone "
    "(the single-agent prompt), with a sampler seed of its own; a multi-model method's "
    "trajectory is the mean of its models (two, or K in a chain). Each claim is one pre-stated "
    "test over seeds (paired by seed); Holm's method adjusts the p-values within each task, and "
    "a verdict is *supported* or *contradicted* on this model only when its adjusted p < 0.05, "
    "*inconclusive* otherwise, with the reason (`benchmarks/evidence/claims.py` and "
    "`benchmarks/evidence/stats.py` state the rules). \"detectable\" is the effect {seeds} "
    "seed(s) like these would find 80% of the time; each verdict carries the model's measured "
    "mechanism. "
    "Per-method frontier tables are exploratory. In-training tables give the mean of the last "
    "{window} iterations of each seed, mean ± std over seeds; their *pioneer*/*observer* rows "
    "(*observer_k* in a chain of K agents) follow whichever model held that position.")


def render(data: RunData, plots: dict[str, list[str]] | None = None,
           preamble: list[str] | None = None) -> str:
    """The whole markdown report (`preamble`: lines placed before any claim or table)."""
    plots = plots or {}
    claims = all_claims(data)
    shared, claims_said = shared_reasons(claims)
    out = ["# CORY benchmark report", "", headline(data, claims), "",
           *at_a_glance(data, claims, plots), *(preamble or []),
           CONVENTIONS.format(window=data.window, seeds=n_seeds(data)), "",
           "## The paper's claims, checked on this run", "", *shared,
           *[c.line() for c in claims_said], "", *rounds_note(data.config or {})]
    if data.config:
        out += ["## Settings (shared by all methods)", "", *settings_lines(data.config), ""]
    for task in data.tasks():
        for kl_coef in data.kl_coefs(task):
            title = task if kl_coef is None else f"{task}, kl_coef = {kl_coef:g}"
            out += [f"## {title}", "", "### Every model answering alone (final point)", "",
                    *alone_table(data, task, kl_coef), ""]
            budgets = budget_table(data, task, kl_coef)
            if budgets:
                out += ["### What each arm spent (per model, means over seeds; alone-role turns: "
                        "those answered from the alone prompt)", "", *budgets, ""]
            arms = arms_table(data, task, kl_coef)
            if arms:
                out += ["### Every method against PPO on the reward–KL frontier (alone, "
                        "exploratory: 95% intervals not corrected for multiple comparisons; "
                        "> 1×: less KL than PPO for the same reward)", "", *arms, ""]
            pioneer = pioneer_table(data, task, kl_coef)
            if pioneer:
                out += ["### Each model at its own pioneer iterations (alone, exploratory: the "
                        "training iterations in which it answered first; with role exchange a "
                        "model is pioneer about half of them)", "", *pioneer, ""]
            out += [f"![{p.split('/')[-1][:-4]}](<{p}>)"
                    for p in plots.get(f"{task}|{kl_coef}", [])]
            out += ["", "### In training (final iterations)", "",
                    *metrics_table(data, task, kl_coef),
                    ""]
            out += rounds_table(data, task, kl_coef)
            out += cut_lines(data, task, kl_coef)
            audit = audit_table(data, task, kl_coef)
            if audit:
                out += ["### Contribution audit", "", *audit, ""]
            out += ["### Samples", "", *sample_lines(data, task, kl_coef), ""]
        ev = eval_table(data, task)
        if ev:
            out += [f"### Test-split pass@k, alone [{task}]", "", *ev, ""]
        out += [f"![pareto](<{p}>)" for p in plots.get(f"{task}|pareto", [])]
    return "\n".join(out)


def mechanism_lines(mechanism: dict) -> list[str]:
    """The report's first section: each task's model has (or lacks) CORY's mechanism."""
    if not mechanism:
        return []
    out = ["## Does the model have CORY's mechanism?", ""]
    for task, m in mechanism.items():
        other = m.get("task") not in (None, task)
        out.append(f"**{task}**" + (f": not measured — {m['not_measured']}." if
                                    "not_measured" in m else
                                    f": measured on task `{m['task']}`, whose model this task "
                                    f"trains from, not on `{task}` itself." if other else ""))
        if "not_measured" not in m:
            out += ["", *format_transfer(m)]
        out.append("")
    return out


def write_report(folder: str | os.PathLike) -> Path:
    """(Re)write a study folder's plots/ and report.md from its records; returns the report."""
    folder = Path(folder)
    data = RunData.load(folder)
    plots = write_plots(data, folder / "plots") if data.rows else {}
    path = folder / "report.md"
    atomic_write(path, render(data, plots, mechanism_lines(data.mechanism)))
    return path


def main(argv: list[str] | None = None) -> None:
    """`python -m benchmarks.report RUN_DIR`: rewrite the report of a study folder."""

    parser = cli.Parser("python -m benchmarks.report", description=main.__doc__)
    parser.add_argument("run_dir")
    folder = Path(parser.parse_args(argv).run_dir)
    if why := no_records(folder):
        parser.error(f"run_dir {why}")
    configure()
    try:
        print(write_report(folder))
    except ValueError as err:
        raise SystemExit(f"python -m benchmarks.report: {err}") from None

