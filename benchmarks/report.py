"""Turn a benchmark run folder into tables, claim checks, plots and a markdown report.

It reads only the folder's records (`records.py`) and never touches a model, so it is fast,
testable on synthetic numbers, and usable on its own:

    python -m benchmarks.report runs/2026-01-01_12-00-00    # (re)write report.md and plots
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import MISSING
from pathlib import Path

import numpy as np

from cory_env.files import atomic_write

from .claims import all_claims
from .config import SETTINGS
from .records import RunData, curves, final_value, mean_curve, mean_std, ordered, select

TABLE_FIELDS = ("task_reward", "kl", "combined_reward", "distinct_1", "distinct_2")
PLOT_FIELDS = ("task_reward", "kl", "combined_reward")


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
                     for role in ("pioneer", "observer")]
        for model, match in rows:
            cells = [str(data.stat(f, **match)) for f in TABLE_FIELDS]
            lines.append(f"| {method} | {model} | " + " | ".join(cells) + " |")
    return lines


def audit_table(data: RunData, task: str, eta) -> list[str]:
    """Two-agent methods: observer gain over the pioneer and the verbatim copy rate."""
    lines = []
    for method in data.methods(task, eta):
        if not data.two_agent(task, method):
            continue
        base = {"task": task, "method": method, "sweep_eta": eta}
        gain = {}
        for seed in ordered(r["seed"] for r in select(data.rows, **base)):
            obs = curves(data.rows, "task_reward", **base, role="observer").get(seed, [])
            pio = curves(data.rows, "task_reward", **base, role="pioneer").get(seed, [])
            n = min(len(obs), len(pio))
            gain[seed] = [o - p for o, p in zip(obs[:n], pio[:n])]
        final_gain = mean_std([final_value(g, data.window) for g in gain.values()])
        all_gain = mean_std([float(np.mean(g)) for g in gain.values() if g])
        copy_final = data.stat("copy_rate", **base, role="observer")
        copy_all = mean_std([float(np.mean(c)) for c in
                             curves(data.rows, "copy_rate", **base, role="observer").values()])
        lines.append(f"| {method} | {final_gain} | {all_gain} | {copy_final} | {copy_all} |")
    if not lines:
        return []
    return ["| method | r_obs − r_pio (final) | r_obs − r_pio (all iterations) | "
            "copy rate (final) | copy rate (all iterations) |", "|---|---|---|---|---|", *lines]


def eval_table(data: RunData, task: str) -> list[str]:
    """pass@1 / pass@k / greedy accuracy on the test split, mean ± std over seeds."""
    evals = select(data.evals, task=task)
    if not evals:
        return []
    k = evals[0].get("k")
    lines = [f"| method | model | eta | pass@1 | pass@{k} | greedy | problems × samples |",
             "|---|---|---|---|---|---|---|"]
    for method in ordered(e["method"] for e in evals):
        for eta in ordered(e["sweep_eta"] for e in select(evals, method=method)):
            for model in ordered(e["model"] for e in select(evals, method=method, sweep_eta=eta)):
                group = select(evals, method=method, sweep_eta=eta, model=model)
                cells = [str(mean_std([e[f] for e in group])) for f in ("pass@1", "pass@k",
                                                                        "greedy")]
                size = f"{group[0]['n_problems']} × {group[0]['n_samples']}"
                eta_s = "–" if eta is None else f"{eta:g}"
                lines.append(f"| {method} | {model} | {eta_s} | " + " | ".join(cells)
                             + f" | {size} |")
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


def render(data: RunData, plots: dict[str, list[str]] | None = None) -> str:
    """The whole markdown report."""
    plots = plots or {}
    out = ["# CORY benchmark report", "",
           f"Final values are the mean of the last {data.window} iterations of each seed, shown "
           "as mean ± std over seeds. A two-agent method's models are LLM1 (`llm_0`) and LLM2 "
           "(`llm_1`); its *pioneer*/*observer* rows follow whichever model held that role at "
           "each iteration, and the claims use the pioneer (the model answering alone).", ""]
    if data.config:
        out += ["## Settings (shared by all methods)", "", *settings_lines(data.config), ""]
    for task in data.tasks():
        for eta in data.etas(task):
            title = task if eta is None else f"{task}, η = {eta:g}"
            out += [f"## {title}", "", *metrics_table(data, task, eta), ""]
            audit = audit_table(data, task, eta)
            if audit:
                out += ["### Contribution audit", "", *audit, ""]
            out += [f"![curves](<{p}>)" for p in plots.get(f"{task}|{eta}", [])] + [""]
            out += ["### Samples", "", *sample_lines(data, task, eta), ""]
        ev = eval_table(data, task)
        if ev:
            out += [f"### Test-split evaluation [{task}]", "", *ev, ""]
        out += [f"![pareto](<{p}>)" for p in plots.get(f"{task}|pareto", [])]
    out += ["## The paper's claims, checked on this run", "",
            *[c.line() for c in all_claims(data)], ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------- plots
def _pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(data: RunData, task: str, eta, path: str | os.PathLike) -> None:
    """Task reward, KL and combined reward against iteration, mean ± std over seeds."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(PLOT_FIELDS), figsize=(5 * len(PLOT_FIELDS), 3.8))
    for method in data.methods(task, eta):
        for label, match in data.series(task, method, eta):
            for ax, field in zip(axes, PLOT_FIELDS):
                mean, std = mean_curve(curves(data.rows, field, **match))
                x = np.arange(len(mean))
                (line,) = ax.plot(x, mean, label=label)
                ax.fill_between(x, mean - std, mean + std, alpha=0.2, color=line.get_color())
    for ax, field in zip(axes, PLOT_FIELDS):
        ax.set_xlabel("iteration")
        ax.set_title(field.replace("_", " "))
    axes[0].legend(fontsize=8)
    fig.suptitle(task if eta is None else f"{task}, η = {eta:g}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_pareto(data: RunData, task: str, path: str | os.PathLike) -> None:
    """Final task reward against final KL, one point per (method, η) with ± std bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    etas = [e for e in data.etas(task) if e is not None]
    for method in ordered(m for e in etas for m in data.methods(task, e)):
        pts = []
        for eta in sorted(etas):
            if method not in data.methods(task, eta):
                continue
            match = data.standalone(task, method, eta)
            pts.append((eta, data.stat("kl", **match), data.stat("task_reward", **match)))
        xs, ys = [p[1].mean for p in pts], [p[2].mean for p in pts]
        bars = ax.errorbar(xs, ys, xerr=[p[1].std for p in pts], yerr=[p[2].std for p in pts],
                           marker="o", capsize=3, label=method)
        for (eta, _, _), x, y in zip(pts, xs, ys):
            ax.annotate(f"η={eta:g}", (x, y), fontsize=7, color=bars.lines[0].get_color())
    ax.set_xlabel("final KL")
    ax.set_ylabel("final task reward")
    ax.set_title(f"{task}: reward vs KL over η")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_plots(data: RunData, folder: str | os.PathLike) -> dict[str, list[str]]:
    """All PNGs of a run; returns their names keyed "task|eta" (and "task|pareto")."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, list[str]] = defaultdict(list)
    for task in data.tasks():
        etas = data.etas(task)
        for eta in etas:
            name = f"curves_{task}.png" if eta is None else f"curves_{task}_eta{eta:g}.png"
            plot_curves(data, task, eta, folder / name)
            made[f"{task}|{eta}"].append(f"plots/{name}")
        if len([e for e in etas if e is not None]) > 1:
            plot_pareto(data, task, folder / f"pareto_{task}.png")
            made[f"{task}|pareto"].append(f"plots/pareto_{task}.png")
    return dict(made)


def write_report(folder: str | os.PathLike) -> Path:
    """(Re)write a run folder's plots/ and report.md from its records; returns the report."""
    folder = Path(folder)
    data = RunData.load(folder)
    plots = write_plots(data, folder / "plots") if data.rows else {}
    path = folder / "report.md"
    atomic_write(path, render(data, plots))
    return path


def main(argv: list[str] | None = None) -> None:
    """`python -m benchmarks.report RUN_DIR`: rewrite the report of a run folder."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("run_dir")
    print(write_report(parser.parse_args(argv).run_dir))


if __name__ == "__main__":
    main()
