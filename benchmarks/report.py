"""Turn a benchmark run folder into tables, claim checks, plots and a markdown report.

It reads only the folder's records (`records.py`) and never touches a model, so it is fast,
testable on synthetic numbers, and usable on its own:

    python -m benchmarks.report runs/2026-01-01_12-00-00    # (re)write report.md and plots
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import MISSING, replace
from pathlib import Path

import numpy as np

from cory_env.files import atomic_write

from .claims import all_claims
from .config import SETTINGS
from .records import RunData, curves, final_value, mean_std, ordered, rotation_of, select

TABLE_FIELDS = ("task_reward", "kl", "combined_reward", "distinct_1", "distinct_2")


# ------------------------------------------------------------------------------- markdown
def metrics_table(data: RunData, task: str, eta) -> list[str]:
    """One row per method model: final task reward, KL, combined reward, distinct-1/2."""
    labels = {"task_reward": "task reward", "kl": "KL", "combined_reward": "combined reward",
              "distinct_1": "distinct-1", "distinct_2": "distinct-2"}
    lines = ["| method | model | " + " | ".join(labels[f] for f in TABLE_FIELDS) + " |",
             "|---|---|" + "---|" * len(TABLE_FIELDS)]
    for method in data.methods(task, eta):
        rows = [(f"{label.split(' ')[-1]} ({match['agent']})" if "agent" in match else "llm_0",
                 match) for label, match in data.series(task, method, eta)]
        if data.two_agent(task, method):
            rows += [(role, {"task": task, "method": method, "sweep_eta": eta, "role": role})
                     for role in data.roles(task, method, eta)]
        for model, match in rows:
            cells = [str(data.stat(f, **match)) for f in TABLE_FIELDS]
            lines.append(f"| {method} | {model} | " + " | ".join(cells) + " |")
    return lines


def audit_table(data: RunData, task: str, eta) -> list[str]:
    """Multi-agent methods: each position's gain over the previous one and how often it
    copied the previous answer verbatim."""
    lines = []
    for method in data.methods(task, eta):
        if not data.two_agent(task, method):
            continue
        base = {"task": task, "method": method, "sweep_eta": eta}
        roles = data.roles(task, method, eta)
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


def alone_table(data: RunData, task: str, eta) -> list[str]:
    """Every model answering alone: base and final task reward, ΣKL and combined reward."""
    lines = ["| method | model | task reward | Σ KL (nats) | combined reward | "
             "evaluation points |", "|---|---|---|---|---|---|"]
    base = [t for m in data.methods(task, eta) for t in data.trajectories(task, m, eta).values()]
    if not base:
        return []
    first = [(t.reward[0], t.kl[0], t.combined[0]) for t in base]
    lines.append("| base | – | " + " | ".join(str(mean_std([f[i] for f in first]))
                                               for i in range(3)) + " | iteration 0 |")
    for method in data.methods(task, eta):
        for model in data.models(task, method, eta):
            trajs = data.trajectories(task, method, eta, model).values()
            cells = [str(mean_std([getattr(t, f)[-1] for t in trajs]))
                     for f in ("reward", "kl", "combined")]
            n = min(len(t.iterations) for t in trajs)
            lines.append(f"| {method} | {model} | " + " | ".join(cells) + f" | {n} |")
    return lines


def arms_table(data: RunData, task: str, eta) -> list[str]:
    """Every method against PPO on the frontier: KL at matched reward, reward at matched KL."""
    from .claims import gather, matched_kl_ratio, matched_reward_gap, ratio_text

    methods = [m for m in data.methods(task, eta) if data.trajectories(task, m, eta)]
    if "ppo" not in methods or len(methods) < 2:
        return []
    lines = ["| method | KL_PPO / KL_method at matched reward | reward_method − reward_PPO at "
             "matched KL | best gain over the base |", "|---|---|---|---|"]
    for m in methods:
        if m == "ppo":
            continue
        inp = gather(data, task, eta, ["ppo", m])
        ratio, _ = matched_kl_ratio(inp.points("ppo"), inp.points(m))
        gap, _ = matched_reward_gap(inp.points(m), inp.points("ppo"))
        lines.append(f"| {m} | {ratio_text(ratio)} | {gap} | {inp.gains[m]} |")
    return lines


def eval_table(data: RunData, task: str) -> list[str]:
    """Exact-match tasks: pass@1 / pass@k (and greedy) alone, base and final, over seeds."""
    evals = [e for e in select(data.evals, task=task) if "pass@1" in e]
    if not evals:
        return []
    k = evals[0].get("k")
    lines = [f"| method | model | eta | pass@1 | pass@{k} | greedy | problems × samples |",
             "|---|---|---|---|---|---|---|"]
    base = select(evals, iteration=0)
    groups = [("base", "–", None, base)] if base else []
    for method in ordered(e["method"] for e in evals):
        for eta in ordered(e["sweep_eta"] for e in select(evals, method=method)):
            for model in ordered(e["model"] for e in select(evals, method=method, sweep_eta=eta)):
                group = select(evals, method=method, sweep_eta=eta, model=model, final=True)
                if group:
                    groups.append((method, model, eta, group))
    for method, model, eta, group in groups:
        cells = [str(mean_std([e[f] for e in group if f in e]))
                 for f in ("pass@1", "pass@k", "greedy")]
        size = f"{group[0]['n_queries']} × {group[0]['n_samples']}"
        eta_s = "–" if eta is None else f"{eta:g}"
        lines.append(f"| {method} | {model} | {eta_s} | " + " | ".join(cells) + f" | {size} |")
    return lines


def sample_lines(data: RunData, task: str, eta, per_method: int = 2) -> list[str]:
    """A few responses per method model from the last iteration of its first seed."""
    lines = []
    for method in data.methods(task, eta):
        rows = select(data.rows, task=task, method=method, sweep_eta=eta)
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
            "init_kl_coef", "adaptive_kl", "kl_target", "kl_penalty", "t_rex", "max_new_tokens",
            "repetition_penalty", "model", "eta_sweep", "final_window", "device", "threads")
    out = []
    for name in keep:
        value: object = config
        for key in SETTINGS.get(name, (name,)):
            value = value.get(key, MISSING) if isinstance(value, dict) else MISSING
        if value is not MISSING:
            out.append(f"- {name}: `{value}`")
    return out


CONVENTIONS = (
    "**How to read it.** The claims and the main plots use the models *answering alone*: every "
    "`eval_every` iterations each model of each method answers the same held-out queries alone "
    "(the single-agent prompt), with a sampler seed of its own; a multi-model method's "
    "trajectory is the mean of its models (two, or K in a chain). Each claim is one pre-stated "
    "test over seeds (paired by seed); Holm's method adjusts the p-values within each task, and "
    "a verdict is *supported* or *contradicted* on this model only when its adjusted p < 0.05, "
    "*inconclusive* otherwise, with the reason (`benchmarks/claims.py` and "
    "`benchmarks/stats.py` state the rules). \"detectable\" is the effect {seeds} seed(s) like "
    "these would find 80% of the time; each verdict carries the model's measured mechanism. "
    "Per-method frontier tables are exploratory. In-training tables give the mean of the last "
    "{window} iterations of each seed, mean ± std over seeds; their *pioneer*/*observer* rows "
    "(*observer_k* in a chain of K agents) follow whichever model held that position.")


def n_seeds(data: RunData) -> int:
    """How many seeds the run's records hold (its settings' count when it has none yet)."""
    seeds = {r["seed"] for r in data.rows} | {r["seed"] for r in data.evals}
    return len(seeds) or len(data.config.get("seeds", [])) or 1


def render(data: RunData, plots: dict[str, list[str]] | None = None,
           preamble: list[str] | None = None) -> str:
    """The whole markdown report (`preamble`: lines placed before any claim or table)."""
    plots = plots or {}
    claims = all_claims(data)
    out = ["# CORY benchmark report", "", *(preamble or []),
           CONVENTIONS.format(window=data.window, seeds=n_seeds(data)), "",
           "## The paper's claims, checked on this run", "", *[c.line() for c in claims], ""]
    if data.config:
        out += ["## Settings (shared by all methods)", "", *settings_lines(data.config), ""]
    for task in data.tasks():
        for eta in data.etas(task):
            title = task if eta is None else f"{task}, η = {eta:g}"
            out += [f"## {title}", "", "### Every model answering alone (final point)", "",
                    *alone_table(data, task, eta), ""]
            arms = arms_table(data, task, eta)
            if arms:
                out += ["### Every method against PPO on the reward–KL frontier (alone, "
                        "exploratory: 95% intervals not corrected for multiple comparisons; "
                        "> 1×: less KL than PPO for the same reward)", "", *arms, ""]
            out += [f"![{p.split('/')[-1][:-4]}](<{p}>)" for p in plots.get(f"{task}|{eta}", [])]
            out += ["", "### In training (final iterations)", "", *metrics_table(data, task, eta),
                    ""]
            audit = audit_table(data, task, eta)
            if audit:
                out += ["### Contribution audit", "", *audit, ""]
            out += ["### Samples", "", *sample_lines(data, task, eta), ""]
        ev = eval_table(data, task)
        if ev:
            out += [f"### Test-split pass@k, alone [{task}]", "", *ev, ""]
        out += [f"![pareto](<{p}>)" for p in plots.get(f"{task}|pareto", [])]
    return "\n".join(out)


# ------------------------------------------------------------------------------- plots
def _pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(methods: list[str]) -> dict[str, str]:
    """One hue per method (its models share it)."""
    palette = ["C0", "C3", "C2", "C1", "C4", "C5", "C6", "C7", "C8", "C9"]
    return {m: palette[i % len(palette)] for i, m in enumerate(methods)}


def exchanges(data: RunData, task: str, method: str, eta) -> list[int]:
    """Iterations at which the method's models exchanged roles (the rotation changed)."""
    flags = {}
    for r in select(data.rows, task=task, method=method, sweep_eta=eta):
        flags[r["iteration"]] = rotation_of(r)
    its = sorted(flags)
    return [i for prev, i in zip(its, its[1:]) if flags[i] != flags[prev]]


def _finish(fig, axes, title: str, path) -> None:
    """Integer iteration ticks, one legend outside the data, save."""
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        if ax.get_xlabel() == "iteration":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)


def _mark_exchanges(data: RunData, task: str, eta, axes, colors) -> None:
    """Dotted grey vertical lines at every role exchange (methods sharing a schedule share
    a label)."""
    schedules: dict[tuple, list[str]] = defaultdict(list)
    for method in data.methods(task, eta):
        its = tuple(exchanges(data, task, method, eta))
        if its:
            schedules[its].append(method)
    for k, (its, methods) in enumerate(schedules.items()):
        for i, it in enumerate(its):
            for ax in axes:
                ax.axvline(it, color="0.5", ls=(0, (1, 2 + k)), lw=0.8, alpha=0.7,
                           label=f"role exchange ({', '.join(methods)})"
                           if i == 0 and ax is axes[0] else None)


def _band(ax, x, ys: np.ndarray, color, ls, label, marker=None) -> None:
    """The mean over seeds (rows of ys) as a line, ± std as a band."""
    mean = ys.mean(0)
    std = ys.std(0, ddof=1) if len(ys) > 1 else np.zeros(len(mean))
    ax.plot(x, mean, color=color, ls=ls, marker=marker, ms=3, label=label)
    ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.12)


def _alone_series(data: RunData, task: str, eta):
    """(method, j, label, trajectories cut to the points every seed reached) per method model."""
    for method in data.methods(task, eta):
        models = data.models(task, method, eta)
        for j, model in enumerate(models):
            trajs = list(data.trajectories(task, method, eta, model).values())
            n = min(len(t.iterations) for t in trajs)
            label = method if len(models) == 1 else f"{method} {model}"
            yield method, j, label, [replace(t, iterations=t.iterations[:n], kl=t.kl[:n],
                                             reward=t.reward[:n], combined=t.combined[:n])
                                     for t in trajs]


def _three_panels(data: RunData, task: str, eta, path, ylabels, title: str, draw) -> None:
    """Three panels against iteration that `draw(axes, colors)` fills; role exchanges marked."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    colors = _colors(data.methods(task, eta))
    draw(axes, colors)
    for ax, ylabel in zip(axes, ylabels):
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
    _mark_exchanges(data, task, eta, axes, colors)
    _finish(fig, axes, title if eta is None else f"{title}, η = {eta:g}", path)


def plot_alone(data: RunData, task: str, eta, path) -> None:
    """Every model answering alone against iteration: task reward, ΣKL, combined reward."""
    def draw(axes, colors):
        for method, j, label, trajs in _alone_series(data, task, eta):
            for ax, f in zip(axes, ("reward", "kl", "combined")):
                _band(ax, trajs[0].iterations, np.array([getattr(t, f) for t in trajs]),
                      colors[method], ("-", "--", "-.", ":")[j % 4], label, marker="o")

    _three_panels(data, task, eta, path, ["task reward", "Σ_t KL (nats)",
                                          f"r − η·ΣKL, η = {data.alone_eta(task):g}"],
                  f"{task}: every model answering alone (mean ± std over seeds)", draw)


def plot_training(data: RunData, task: str, eta, path) -> None:
    """In-training task reward, KL and combined reward per model, role exchanges marked."""
    def draw(axes, colors):
        for method in data.methods(task, eta):
            for j, (label, match) in enumerate(data.series(task, method, eta)):
                for ax, f in zip(axes, ("task_reward", "kl", "combined_reward")):
                    per_seed = list(curves(data.rows, f, **match).values())
                    if not per_seed:
                        continue
                    n = min(len(c) for c in per_seed)
                    _band(ax, np.arange(n), np.array([c[:n] for c in per_seed]),
                          colors[method], ("-", "--")[j % 2], label)

    _three_panels(data, task, eta, path, ["task reward", "Σ_t KL (nats)",
                                          "r − β·ΣKL (current β)"],
                  f"{task}: in training, per model (mean ± std over seeds)", draw)


def plot_positions(data: RunData, task: str, eta, path) -> None:
    """Multi-agent methods, per chain position: in-training task reward and the copy rate of
    the previous answer against iteration (mean ± std over seeds)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    methods = [m for m in data.methods(task, eta) if data.two_agent(task, m)]
    colors = _colors(data.methods(task, eta))
    for method in methods:
        for k, role in enumerate(data.roles(task, method, eta)):
            match = {"task": task, "method": method, "sweep_eta": eta, "role": role}
            for ax, f in zip(axes, ("task_reward", "copy_rate")):
                per_seed = [c for c in curves(data.rows, f, **match).values() if c]
                if per_seed:
                    n = min(len(c) for c in per_seed)
                    _band(ax, np.arange(n), np.array([c[:n] for c in per_seed]),
                          colors[method], ("-", "--", "-.", ":")[k % 4], f"{method} {role}")
    for ax, ylabel in zip(axes, ("task reward, in training", "copy rate of the previous "
                                 "answer")):
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
    _mark_exchanges(data, task, eta, axes, colors)
    title = f"{task}: per chain position"
    _finish(fig, axes, title if eta is None else f"{title}, η = {eta:g}", path)


def plot_frontier(data: RunData, task: str, eta, path) -> None:
    """Alone task reward against alone ΣKL, one line per method and model (mean over seeds,
    iteration order; the first point is the base model)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    colors = _colors(data.methods(task, eta))
    for method, j, label, trajs in _alone_series(data, task, eta):
        ax.plot(np.mean([t.kl for t in trajs], 0), np.mean([t.reward for t in trajs], 0),
                color=colors[method], ls=("-", "--", "-.", ":")[j % 4], marker="o", ms=3,
                label=label)
    ax.set_xlabel("Σ_t KL to the reference (nats), alone")
    ax.set_ylabel("task reward, alone")
    title = f"{task}: reward–KL frontier"
    _finish(fig, [ax], title if eta is None else f"{title}, η = {eta:g}", path)


def plot_pareto(data: RunData, task: str, path: str | os.PathLike) -> None:
    """Final alone reward against final alone ΣKL per fixed η: each seed's front (thin) and
    the mean over seeds, one line per method (η labels offset so they do not overlap)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    etas = sorted(e for e in data.etas(task) if e is not None)
    methods = ordered(m for e in etas for m in data.methods(task, e))
    colors = _colors(methods)
    for mi, method in enumerate(methods):
        means = []
        per_seed: dict[int, list] = defaultdict(list)
        for eta in etas:
            trajs = data.trajectories(task, method, eta)
            finals = [(t.kl[-1], t.reward[-1]) for t in trajs.values()]
            if not finals:
                continue
            for seed, t in trajs.items():
                per_seed[seed].append((t.kl[-1], t.reward[-1]))
            means.append((eta, *np.mean(finals, 0)))
        for front in per_seed.values():  # each seed's own front, thin
            ax.plot(*zip(*front), color=colors[method], lw=0.6, alpha=0.35, marker=".", ms=4)
        if not means:
            continue
        ax.plot([m[1] for m in means], [m[2] for m in means], color=colors[method], marker="o",
                label=method)
        for eta, x, y in means:
            ax.annotate(f"η={eta:g}", (x, y), xytext=(6, 8 * (mi - len(methods) / 2) + 3),
                        textcoords="offset points", fontsize=7, color=colors[method])
    ax.set_xlabel("final Σ_t KL (nats), alone")
    ax.set_ylabel("final task reward, alone")
    _finish(fig, [ax], f"{task}: final reward vs KL over fixed η (thin: each seed)", path)


def write_plots(data: RunData, folder: str | os.PathLike) -> dict[str, list[str]]:
    """All PNGs of a run; returns their names keyed "task|eta" (and "task|pareto")."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, list[str]] = defaultdict(list)
    for task in data.tasks():
        etas = data.etas(task)
        for eta in etas:
            tail = "" if eta is None else f"_eta{eta:g}"
            plots = [(f"curves_{task}{tail}.png", plot_training)]
            if any(data.two_agent(task, m) for m in data.methods(task, eta)):
                plots.append((f"positions_{task}{tail}.png", plot_positions))
            if any(data.trajectories(task, m, eta) for m in data.methods(task, eta)):
                plots = [(f"alone_{task}{tail}.png", plot_alone),
                         (f"frontier_{task}{tail}.png", plot_frontier), *plots]
            for name, plot in plots:
                plot(data, task, eta, folder / name)
                made[f"{task}|{eta}"].append(f"plots/{name}")
        if len([e for e in etas if e is not None]) > 1:
            plot_pareto(data, task, folder / f"pareto_{task}.png")
            made[f"{task}|pareto"].append(f"plots/pareto_{task}.png")
    return dict(made)


def mechanism_lines(mechanism: dict) -> list[str]:
    """The report's first section: each task's model has (or lacks) CORY's mechanism."""
    from agents.refmodels.transfer import format_transfer

    if not mechanism:
        return []
    out = ["## Does the model have CORY's mechanism? (measured before any comparison)", ""]
    for task, m in mechanism.items():
        out.append(f"**{task}**" + (f": not measured — {m['not_measured']}." if
                                    "not_measured" in m else ""))
        if "not_measured" not in m:
            out += ["", *format_transfer(m)]
        out.append("")
    return out


def write_report(folder: str | os.PathLike) -> Path:
    """(Re)write a run folder's plots/ and report.md from its records; returns the report."""
    folder = Path(folder)
    data = RunData.load(folder)
    plots = write_plots(data, folder / "plots") if data.rows else {}
    mech = folder / "mechanism.json"
    preamble = mechanism_lines(json.loads(mech.read_text())) if mech.exists() else []
    path = folder / "report.md"
    atomic_write(path, render(data, plots, preamble))
    return path


def main(argv: list[str] | None = None) -> None:
    """`python -m benchmarks.report RUN_DIR`: rewrite the report of a run folder."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("run_dir")
    print(write_report(parser.parse_args(argv).run_dir))


if __name__ == "__main__":
    main()
