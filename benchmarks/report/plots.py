"""The study folder's plots (matplotlib, Agg): every model alone, the in-training curves, chain
positions, the reward–KL frontier and a kl_coef sweep's Pareto front. Reads only the records."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.evidence.records import RunData, curves, ordered, rotation_of, select
from benchmarks.report.summary import ranked_methods


def _pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(methods: list[str]) -> dict[str, str]:
    """One hue per method (its models share it)."""
    palette = ["C0", "C3", "C2", "C1", "C4", "C5", "C6", "C8", "C9", "navy", "maroon",
               "teal"]  # no grey: grey is PPO's reference in small multiples
    return {m: palette[i % len(palette)] for i, m in enumerate(methods)}


def exchanges(data: RunData, task: str, method: str, kl_coef) -> list[int]:
    """Iterations at which the method's models exchanged roles (the rotation changed)."""
    flags = {}
    for r in select(data.rows, task=task, method=method, swept_kl_coef=kl_coef):
        flags[r["iteration"]] = rotation_of(r)
    its = sorted(flags)
    return [i for prev, i in zip(its, its[1:]) if flags[i] != flags[prev]]


def _finish(fig, axes, title: str, path, legend: bool = True) -> None:
    """Integer iteration ticks, one legend outside the data (unless each panel has its own),
    save."""
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        if ax.get_xlabel() == "iteration":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if legend:
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)


def _mark_exchanges(data: RunData, task: str, kl_coef, axes, colors) -> None:
    """Dotted grey vertical lines at every role exchange (methods sharing a schedule share
    a label)."""
    schedules: dict[tuple, list[str]] = defaultdict(list)
    for method in data.methods(task, kl_coef):
        its = tuple(exchanges(data, task, method, kl_coef))
        if its:
            schedules[its].append(method)
    for k, (its, methods) in enumerate(schedules.items()):
        for i, it in enumerate(its):
            for ax in axes:
                ax.axvline(it, color="0.5", ls=(0, (1, 2 + k)), lw=0.8, alpha=0.7,
                           label=f"role exchange ({', '.join(methods)})"
                           if i == 0 and ax is axes[0] else None)


SMALL_MULTIPLES = 4  # more methods than this: one panel per method, PPO in grey in each
BOUNDS = {"kl": (0.0, None), "copy_rate": (0.0, 1.0)}  # what each quantity allows


def _band(ax, x, ys: np.ndarray, color, ls, label, marker=None,
          bounds: tuple[float | None, float | None] = (None, None)) -> None:
    """The mean over seeds (rows of ys) as a line, ± std as a band clipped to `bounds`."""
    mean = ys.mean(0)
    std = ys.std(0, ddof=1) if len(ys) > 1 else np.zeros(len(mean))
    lo, hi = mean - std, mean + std
    if bounds[0] is not None:
        lo = np.maximum(lo, bounds[0])
    if bounds[1] is not None:
        hi = np.minimum(hi, bounds[1])
    ax.plot(x, mean, color=color, ls=ls, marker=marker, ms=3, label=label)
    ax.fill_between(x, lo, hi, color=color, alpha=0.12)


def _alone_series(data: RunData, task: str, kl_coef):
    """(method, j, label, trajectories cut to the points every seed reached) per method model."""
    for method in data.methods(task, kl_coef):
        models = data.alone_agents(task, method, kl_coef)
        for j, model in enumerate(models):
            trajs = list(data.trajectories(task, method, kl_coef, model).values())
            n = min(len(t.iterations) for t in trajs)
            label = method if len(models) == 1 else f"{method} {model}"
            yield method, j, label, [replace(t, iterations=t.iterations[:n], kl=t.kl[:n],
                                             reward=t.reward[:n], combined=t.combined[:n])
                                     for t in trajs]


def _three_panels(data: RunData, task: str, kl_coef, path, ylabels, title: str, draw) -> None:
    """Three panels against iteration that `draw(axes, colors)` fills; role exchanges marked."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    colors = _colors(data.methods(task, kl_coef))
    draw(axes, colors)
    for ax, ylabel in zip(axes, ylabels):
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
    _mark_exchanges(data, task, kl_coef, axes, colors)
    _finish(fig, axes, title if kl_coef is None else f"{title}, kl_coef = {kl_coef:g}", path)


def plot_alone(data: RunData, task: str, kl_coef, path) -> None:
    """Every model answering alone against iteration: task reward, ΣKL, combined reward (one
    row of panels per method beyond SMALL_MULTIPLES methods, PPO in grey in each)."""
    ylabels = ["task reward", "Σ_t KL (nats)", f"r − c·ΣKL, c = {data.report_kl_coef(task):g}"]
    title = f"{task}: every model answering alone (mean ± std over seeds)"
    fields = ("reward", "kl", "combined")
    series = list(_alone_series(data, task, kl_coef))
    methods = data.methods(task, kl_coef)

    def draw_one(axes, colors, method, with_ppo=False):
        for m, j, label, trajs in series:
            if m == method or (with_ppo and m == "ppo"):
                grey = with_ppo and m == "ppo" and method != "ppo"
                for ax, f in zip(axes, fields):
                    _band(ax, trajs[0].iterations, np.array([getattr(t, f) for t in trajs]),
                          "0.6" if grey else colors[m], ("-", "--", "-.", ":")[j % 4], label,
                          marker=None if grey else "o", bounds=BOUNDS.get(f, (None, None)))

    if len(methods) <= SMALL_MULTIPLES:
        _three_panels(data, task, kl_coef, path, ylabels, title,
                      lambda axes, colors: [draw_one(axes, colors, m) for m in methods])
        return
    _small_multiples(data, task, kl_coef, path, ylabels, title,
                     lambda axes, colors, m: draw_one(axes, colors, m, with_ppo=True))


def _small_multiples(data: RunData, task: str, kl_coef, path, ylabels, title: str,
                     draw) -> None:
    """One row of three panels per method, columns sharing their y axis; `draw(axes, colors,
    method)` fills a row."""
    plt = _pyplot()
    methods = data.methods(task, kl_coef)
    fig, grid = plt.subplots(len(methods), 3, figsize=(15, 2.3 * len(methods)), sharey="col",
                             sharex=True, squeeze=False)
    colors = _colors(methods)
    for axes, method in zip(grid, methods):
        draw(axes, colors, method)
        axes[0].set_title(method, loc="left", fontsize=9)
        for ax in axes:
            ax.legend(fontsize=6, loc="best")
    for ax in grid[-1]:
        ax.set_xlabel("iteration")
    for ax, ylabel in zip(grid[0], ylabels):
        ax.set_ylabel(ylabel, fontsize=8)
    _finish(fig, list(grid.flat), title if kl_coef is None else f"{title}, kl_coef = "
            f"{kl_coef:g}", path, legend=False)


def plot_training(data: RunData, task: str, kl_coef, path) -> None:
    """In-training task reward, KL and combined reward per model, role exchanges marked."""
    def draw(axes, colors):
        for method in data.methods(task, kl_coef):
            for j, (label, match) in enumerate(data.series(task, method, kl_coef)):
                for ax, f in zip(axes, ("task_reward", "kl", "combined_reward")):
                    per_seed = list(curves(data.rows, f, **match).values())
                    if not per_seed:
                        continue
                    n = min(len(c) for c in per_seed)
                    _band(ax, np.arange(n), np.array([c[:n] for c in per_seed]),
                          colors[method], ("-", "--")[j % 2], label,
                          bounds=BOUNDS.get(f, (None, None)))

    _three_panels(data, task, kl_coef, path, ["task reward", "Σ_t KL (nats)",
                                          "r − c·ΣKL (one c per run)"],
                  f"{task}: in training, per model (mean ± std over seeds)", draw)


def plot_positions(data: RunData, task: str, kl_coef, path) -> None:
    """Multi-agent methods, per chain position: in-training task reward and the copy rate of
    the previous answer against iteration (mean ± std over seeds)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    methods = [m for m in data.methods(task, kl_coef) if data.two_agent(task, m)]
    colors = _colors(data.methods(task, kl_coef))
    for method in methods:
        for k, role in enumerate(data.roles(task, method, kl_coef)):
            match = {"task": task, "method": method, "swept_kl_coef": kl_coef, "role": role}
            for ax, f in zip(axes, ("task_reward", "copy_rate")):
                per_seed = [c for c in curves(data.rows, f, **match).values() if c]
                if per_seed:
                    n = min(len(c) for c in per_seed)
                    _band(ax, np.arange(n), np.array([c[:n] for c in per_seed]),
                          colors[method], ("-", "--", "-.", ":")[k % 4], f"{method} {role}",
                          bounds=BOUNDS.get(f, (None, None)))
    for ax, ylabel in zip(axes, ("task reward, in training", "copy rate of the previous "
                                 "answer")):
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
    _mark_exchanges(data, task, kl_coef, axes, colors)
    title = f"{task}: per chain position"
    _finish(fig, axes, title if kl_coef is None else f"{title}, kl_coef = {kl_coef:g}", path)


def plot_frontier(data: RunData, task: str, kl_coef, path) -> None:
    """Alone task reward against alone ΣKL, one line per method and model (mean over seeds,
    iteration order; the first point is the base model), each point's std over seeds on both
    axes as error bars; one panel per method beyond SMALL_MULTIPLES methods, PPO in grey."""
    plt = _pyplot()
    methods = data.methods(task, kl_coef)
    many = len(methods) > SMALL_MULTIPLES
    cols = 3 if many else 1
    rows = -(-len(methods) // cols) if many else 1
    fig, grid = plt.subplots(rows, cols, figsize=(6.5 if not many else 15, 4.5 if not many
                                                  else 3.2 * rows),
                             sharex=True, sharey=True, squeeze=False)
    colors = _colors(methods)
    series = list(_alone_series(data, task, kl_coef))
    for i, method in enumerate(methods if many else [None]):
        ax = grid.flat[i]
        for m, j, label, trajs in series:
            grey = many and m == "ppo" and method != "ppo"
            if many and m != method and not grey:
                continue
            kl, reward = np.array([t.kl for t in trajs]), np.array([t.reward for t in trajs])
            spread = (lambda a: a.std(0, ddof=1)) if len(trajs) > 1 else np.zeros_like
            ax.errorbar(kl.mean(0), reward.mean(0), xerr=spread(kl), yerr=spread(reward),
                        color="0.6" if grey else colors[m], ls=("-", "--", "-.", ":")[j % 4],
                        marker="o", ms=3, lw=1, elinewidth=0.6, capsize=1.5, alpha=0.9,
                        label=label)
        if many:
            ax.set_title(method, loc="left", fontsize=9)
            ax.legend(fontsize=6, loc="best")
        ax.set_xlabel("Σ_t KL to the reference (nats), alone")
        ax.set_ylabel("task reward, alone")
    for ax in list(grid.flat)[len(methods) if many else 1:]:
        ax.set_visible(False)
    title = f"{task}: reward–KL frontier (bars: std over seeds)"
    _finish(fig, list(grid.flat), title if kl_coef is None else f"{title}, kl_coef = "
            f"{kl_coef:g}", path, legend=not many)


def plot_ranking(data: RunData, task: str, path) -> bool:
    """The methods of a task ranked by mean alone gain over the base, each with its 95% t
    interval over seeds, best at the top; False (nothing drawn) with fewer than two."""
    ranked = [(iv, method) for iv, method, _ in reversed(ranked_methods(data, task))]
    if len(ranked) < 2:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 0.45 * len(ranked) + 1.2))
    colors = _colors(data.methods(task, None))
    for y, (iv, method) in enumerate(ranked):
        low = iv.low if np.isfinite(iv.low) else iv.mean
        high = iv.high if np.isfinite(iv.high) else iv.mean
        ax.errorbar(iv.mean, y, xerr=[[iv.mean - low], [high - iv.mean]], fmt="o",
                    color=colors[method], capsize=3)
    ax.axvline(0, color="0.5", lw=0.8, ls=":")
    ax.set_yticks(range(len(ranked)), [m for _, m in ranked])
    ax.set_xlabel("mean alone reward over the base (95% CI over seeds)")
    _finish(fig, [ax], f"{task}: methods ranked", path, legend=False)
    return True


def plot_pareto(data: RunData, task: str, path: str | os.PathLike) -> None:
    """Final alone reward against final alone ΣKL per fixed kl_coef: each seed's front (thin) and
    the mean over seeds, one line per method (labels offset so they do not overlap)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    kl_coefs = sorted(e for e in data.kl_coefs(task) if e is not None)
    methods = ordered(m for e in kl_coefs for m in data.methods(task, e))
    colors = _colors(methods)
    for mi, method in enumerate(methods):
        means = []
        per_seed: dict[int, list] = defaultdict(list)
        for kl_coef in kl_coefs:
            trajs = data.trajectories(task, method, kl_coef)
            finals = [(t.kl[-1], t.reward[-1]) for t in trajs.values()]
            if not finals:
                continue
            for seed, t in trajs.items():
                per_seed[seed].append((t.kl[-1], t.reward[-1]))
            means.append((kl_coef, *np.mean(finals, 0)))
        for front in per_seed.values():  # each seed's own front, thin
            ax.plot(*zip(*front), color=colors[method], lw=0.6, alpha=0.35, marker=".", ms=4)
        if not means:
            continue
        ax.plot([m[1] for m in means], [m[2] for m in means], color=colors[method], marker="o",
                label=method)
        for kl_coef, x, y in means:
            ax.annotate(f"kl_coef={kl_coef:g}", (x, y), xytext=(6, 8 * (mi - len(methods) / 2) + 3),
                        textcoords="offset points", fontsize=7, color=colors[method])
    ax.set_xlabel("final Σ_t KL (nats), alone")
    ax.set_ylabel("final task reward, alone")
    _finish(fig, [ax], f"{task}: final reward vs KL over fixed kl_coef (thin: each seed)", path)


def write_plots(data: RunData, folder: str | os.PathLike) -> dict[str, list[str]]:
    """All PNGs of a run; returns their names keyed "task|kl_coef" (and "task|pareto")."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, list[str]] = defaultdict(list)
    for task in data.tasks():
        kl_coefs = data.kl_coefs(task)
        for kl_coef in kl_coefs:
            tail = "" if kl_coef is None else f"_kl{kl_coef:g}"
            plots = [(f"curves_{task}{tail}.png", plot_training)]
            if any(data.two_agent(task, m) for m in data.methods(task, kl_coef)):
                plots.append((f"positions_{task}{tail}.png", plot_positions))
            if any(data.trajectories(task, m, kl_coef) for m in data.methods(task, kl_coef)):
                plots = [(f"alone_{task}{tail}.png", plot_alone),
                         (f"frontier_{task}{tail}.png", plot_frontier), *plots]
            for name, plot in plots:
                plot(data, task, kl_coef, folder / name)
                made[f"{task}|{kl_coef}"].append(f"plots/{name}")
        if None in kl_coefs and plot_ranking(data, task, folder / f"ranking_{task}.png"):
            made[f"{task}|ranking"].append(f"plots/ranking_{task}.png")
        if len([e for e in kl_coefs if e is not None]) > 1:
            plot_pareto(data, task, folder / f"pareto_{task}.png")
            made[f"{task}|pareto"].append(f"plots/pareto_{task}.png")
    return dict(made)


