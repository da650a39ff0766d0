"""Turn a benchmark run folder into numbers, claim checks, plots and a markdown report.

Everything here reads plain records (the rows of ``metrics.jsonl`` and ``eval.jsonl``) and
never touches a model, so it is fast, testable on synthetic numbers, and usable on its own:

    python -m benchmarks.report runs/2026-01-01_12-00-00    # (re)write report.md and plots

Conventions used throughout (and printed in the report):

* A **final** value is the mean of the last ``window`` iterations of one seed's curve; the
  table shows mean ± std over seeds (sample std, ddof=1; 0 for a single seed).
* A two-agent method's **stand-alone** numbers are those of its *pioneer* at each iteration
  (the model answering alone, as single PPO does); its models are also shown one by one
  (LLM1 = ``llm_0``, LLM2 = ``llm_1``, as in the paper's plots).
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPRODUCED, NOT_REPRODUCED, NOT_RUN = "reproduced", "not reproduced at this scale", "not run"
MATH_TASKS = ("arithmetic", "gsm8k")
KNOWN_REWARD_RANGE = {"arithmetic": 1.0, "gsm8k": 1.0}  # exact-match rewards lie in [0, 1]
SIMILAR_FRACTION = 0.10  # "similar" / "declines" / "raises": 10% of the range (or 1 std)
TABLE_FIELDS = ("task_reward", "kl", "combined_reward", "distinct_1", "distinct_2")
PLOT_FIELDS = ("task_reward", "kl", "combined_reward")
ABLATIONS = ("cory-no-kt", "cory-no-re")


# ------------------------------------------------------------------------------- records
def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """All records of a JSONL file (an absent file has none; a torn last line is skipped)."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def select(rows: Iterable[dict], **match) -> list[dict]:
    """The rows whose fields equal every keyword given."""
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def ordered(values: Iterable) -> list:
    """Distinct values in first-seen order."""
    return list(dict.fromkeys(values))


# ------------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class Stat:
    """A mean ± std over n seeds."""

    mean: float
    std: float
    n: int

    def __str__(self) -> str:
        if self.n == 0:
            return "–"
        return f"{fmt(self.mean)} ± {fmt(self.std)}"


def fmt(x: float) -> str:
    """A compact number for tables: 3 significant digits, scientific when tiny or huge."""
    if x is None or not math.isfinite(x):
        return "nan"
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.2e}"
    return f"{x:.3g}"


def mean_std(values: Sequence[float]) -> Stat:
    """Mean and sample standard deviation (ddof=1; 0 for one value) of finite values."""
    xs = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if len(xs) == 0:
        return Stat(float("nan"), float("nan"), 0)
    return Stat(float(xs.mean()), float(xs.std(ddof=1)) if len(xs) > 1 else 0.0, len(xs))


def curves(rows: Iterable[dict], field: str, **match) -> dict[int, list[float]]:
    """Per-seed curves of a field over iterations, for the rows matching the keywords."""
    by_seed: dict[int, dict[int, float]] = defaultdict(dict)
    for r in select(rows, **match):
        if field in r and r[field] is not None:
            by_seed[r["seed"]][r["iteration"]] = float(r[field])
    return {s: [pts[i] for i in sorted(pts)] for s, pts in sorted(by_seed.items())}


def final_value(curve: Sequence[float], window: int) -> float:
    """The mean of a curve's last `window` points."""
    return float(np.mean(curve[-window:])) if len(curve) else float("nan")


def final_stat(rows: Iterable[dict], field: str, window: int, **match) -> Stat:
    """Final value (mean of the last `window` iterations) per seed, then mean ± std over seeds."""
    return mean_std([final_value(c, window) for c in curves(rows, field, **match).values()])


def mean_curve(per_seed: dict[int, list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise mean and std over seeds, over the iterations every seed reached."""
    if not per_seed:
        return np.zeros(0), np.zeros(0)
    n = min(len(c) for c in per_seed.values())
    stack = np.array([c[:n] for c in per_seed.values()], dtype=np.float64)
    return stack.mean(0), stack.std(0, ddof=1) if len(stack) > 1 else np.zeros(n)


def moving_average(curve: Sequence[float], window: int) -> np.ndarray:
    """Trailing means of `window` points (the first point is the mean of the first window)."""
    x = np.asarray(curve, dtype=np.float64)
    if len(x) < window:
        return x[-1:] if len(x) else x
    return np.convolve(x, np.ones(window) / window, mode="valid")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def copy_rate(pioneer_texts: Sequence[str], observer_texts: Sequence[str]) -> float:
    """Share of episodes whose observer answer equals the pioneer's verbatim (after strip)."""
    if len(pioneer_texts) != len(observer_texts):
        raise ValueError(f"texts are not aligned: {len(pioneer_texts)} pioneer vs "
                         f"{len(observer_texts)} observer")
    if not pioneer_texts:
        return float("nan")
    same = sum(p.strip() == o.strip() for p, o in zip(pioneer_texts, observer_texts))
    return same / len(pioneer_texts)


# ------------------------------------------------------------------------------- claims
@dataclass
class Claim:
    """One of the paper's claims, checked against this run's numbers."""

    name: str
    status: str
    numbers: str

    @classmethod
    def checked(cls, name: str, ok: bool, numbers: str) -> Claim:
        """A claim whose check ran: reproduced if it passed, else not reproduced."""
        return cls(name, REPRODUCED if ok else NOT_REPRODUCED, numbers)

    def line(self) -> str:
        """The report line: name, verdict and the numbers used."""
        return f"- **{self.name}**: **{self.status}**. {self.numbers}"


def tolerance(reward_range: float, *stats: Stat) -> float:
    """The "same within noise" margin: 10% of the reward range, or the largest std if bigger."""
    stds = [s.std for s in stats if s.n and math.isfinite(s.std)]
    return max([SIMILAR_FRACTION * reward_range, *stds])


def check_reward_and_kl(ppo_reward: Stat, cory_reward: Stat, ppo_kl: Stat, cory_kl: Stat,
                        reward_range: float) -> tuple[bool, str]:
    """Claim 1: |Δ task reward| <= tolerance, and PPO's final KL > 2x CORY's."""
    tol = tolerance(reward_range, ppo_reward, cory_reward)
    gap = abs(ppo_reward.mean - cory_reward.mean)
    similar, ratio = gap <= tol, ppo_kl.mean / cory_kl.mean if cory_kl.mean > 0 else math.inf
    text = (f"task reward PPO {ppo_reward} vs CORY {cory_reward}: |Δ| = {fmt(gap)} "
            f"{'<=' if similar else '>'} tolerance {fmt(tol)} (max of 10% of range "
            f"{fmt(reward_range)} and 1 std) -> {'similar' if similar else 'not similar'}; "
            f"KL PPO {ppo_kl} vs CORY {cory_kl}: ratio {fmt(ratio)} "
            f"{'>' if ratio > 2 else '<='} 2")
    return similar and ratio > 2, text


def peak_drop(mean_curve_: Sequence[float], window: int) -> tuple[float, float, int]:
    """(peak, final, peak index) of the `window`-point moving average of a curve."""
    smooth = moving_average(mean_curve_, window)
    if len(smooth) == 0:
        return float("nan"), float("nan"), -1
    i = int(np.argmax(smooth))
    return float(smooth[i]), float(smooth[-1]), i


def check_peak_then_decline(ppo_curve: Sequence[float], cory_curve: Sequence[float],
                            window: int, threshold: float) -> tuple[bool, str]:
    """Claim 2: PPO's smoothed reward drops >= threshold after its peak; CORY's drops less."""
    p_peak, p_final, p_at = peak_drop(ppo_curve, window)
    c_peak, c_final, _ = peak_drop(cory_curve, window)
    ppo_declines = p_peak - p_final >= threshold and p_at < len(moving_average(ppo_curve,
                                                                              window)) - 1
    cory_stable = c_peak - c_final < threshold
    text = (f"{window}-iteration moving average of the mean task reward: PPO peak "
            f"{fmt(p_peak)} (window ending at iteration {p_at + window - 1}), final "
            f"{fmt(p_final)}, drop {fmt(p_peak - p_final)} "
            f"({'>=' if ppo_declines else 'below'} threshold {fmt(threshold)}); CORY peak "
            f"{fmt(c_peak)}, final {fmt(c_final)}, drop {fmt(c_peak - c_final)} "
            f"({'stable' if cory_stable else 'declines'})")
    return ppo_declines and cory_stable, text


def check_ablation_kl(cory_kl: Stat, ablation_kl: dict[str, Stat]) -> tuple[bool, str]:
    """Claim 3: each ablation's final KL exceeds CORY's by > max(10% of it, CORY's std)."""
    margin = max(SIMILAR_FRACTION * abs(cory_kl.mean), cory_kl.std if cory_kl.n else 0.0)
    raised = {m: s.mean - cory_kl.mean > margin for m, s in ablation_kl.items()}
    parts = [f"{m} KL {s} ({'raised' if raised[m] else 'not raised'})"
             for m, s in ablation_kl.items()]
    text = f"CORY KL {cory_kl}, margin {fmt(margin)}; " + "; ".join(parts)
    return all(raised.values()) and bool(raised), text


# ------------------------------------------------------------------------------- the run
class RunData:
    """A run folder's records with the lookups the report needs."""

    def __init__(self, rows: list[dict], evals: list[dict] | None = None,
                 config: dict | None = None, window: int | None = None):
        self.rows, self.evals, self.config = rows, evals or [], config or {}
        self.window = window or int(self.config.get("final_window", 5))

    @classmethod
    def load(cls, folder: str | os.PathLike) -> RunData:
        """Read metrics.jsonl, eval.jsonl and run_config.json from a run folder."""
        folder = Path(folder)
        config = {}
        if (folder / "run_config.json").exists():
            config = json.loads((folder / "run_config.json").read_text())
        return cls(read_jsonl(folder / "metrics.jsonl"), read_jsonl(folder / "eval.jsonl"),
                   config)

    def tasks(self) -> list[str]:
        """Tasks in run order."""
        return ordered(r["task"] for r in self.rows)

    def etas(self, task: str) -> list:
        """KL-coefficient settings run on a task (None = the preset's own)."""
        return ordered(r["sweep_eta"] for r in select(self.rows, task=task))

    def methods(self, task: str, eta=None) -> list[str]:
        """Methods run on a task at one eta."""
        return ordered(r["method"] for r in select(self.rows, task=task, sweep_eta=eta))

    def agents(self, task: str, method: str) -> list[str]:
        """The method's models (llm_0 and, for two-agent methods, llm_1)."""
        return sorted(ordered(r["agent"] for r in select(self.rows, task=task, method=method)))

    def two_agent(self, task: str, method: str) -> bool:
        """True when the method trains two models."""
        return len(self.agents(task, method)) > 1

    def standalone(self, task: str, method: str, eta) -> dict:
        """Matching keywords for the model answering alone: PPO's only model, else the pioneer."""
        base = {"task": task, "method": method, "sweep_eta": eta}
        return {**base, "role": "pioneer"} if self.two_agent(task, method) else base

    def stat(self, field: str, **match) -> Stat:
        """Final-value mean ± std over seeds."""
        return final_stat(self.rows, field, self.window, **match)

    def reward_range(self, task: str) -> float:
        """The task's reward range: known for exact-match tasks, else the observed span."""
        if task in KNOWN_REWARD_RANGE:
            return KNOWN_REWARD_RANGE[task]
        values = [r["task_reward"] for r in select(self.rows, task=task)]
        return float(max(values) - min(values)) if values else 0.0

    def series(self, task: str, method: str, eta) -> list[tuple[str, dict]]:
        """(label, match) of each model of a method, named as in the paper's plots."""
        if not self.two_agent(task, method):
            return [(method, {"task": task, "method": method, "sweep_eta": eta})]
        return [(f"{method} LLM{i + 1}", {"task": task, "method": method, "sweep_eta": eta,
                                          "agent": a})
                for i, a in enumerate(self.agents(task, method))]


# ------------------------------------------------------------------------------- claims
def claim_reward_kl(data: RunData, task: str, eta) -> Claim:
    """Claim (1) on one task."""
    name = f"(1) similar task reward, PPO's KL > 2x CORY's [{task}]"
    if not {"ppo", "cory"} <= set(data.methods(task, eta)):
        return Claim(name, NOT_RUN, "needs methods ppo and cory on this task.")
    p, c = data.standalone(task, "ppo", eta), data.standalone(task, "cory", eta)
    ok, text = check_reward_and_kl(data.stat("task_reward", **p), data.stat("task_reward", **c),
                                   data.stat("kl", **p), data.stat("kl", **c),
                                   data.reward_range(task))
    return Claim.checked(name, ok, text)


def claim_peak_decline(data: RunData, task: str, eta) -> Claim:
    """Claim (2) on a math task."""
    name = f"(2) PPO's reward peaks then declines, CORY stays stable [{task}]"
    if not {"ppo", "cory"} <= set(data.methods(task, eta)):
        return Claim(name, NOT_RUN, "needs methods ppo and cory on this task.")
    p, c = data.standalone(task, "ppo", eta), data.standalone(task, "cory", eta)
    ppo, _ = mean_curve(curves(data.rows, "task_reward", **p))
    cory, _ = mean_curve(curves(data.rows, "task_reward", **c))
    threshold = tolerance(data.reward_range(task), data.stat("task_reward", **p),
                          data.stat("task_reward", **c))
    ok, text = check_peak_then_decline(ppo, cory, data.window, threshold)
    return Claim.checked(name, ok, text)


def claim_ablations(data: RunData, task: str, eta) -> Claim:
    """Claim (3) on one task: the no-KT and no-RE ablations raise KL."""
    name = f"(3) no-knowledge-transfer and no-role-exchange raise KL vs CORY [{task}]"
    methods = data.methods(task, eta)
    present = [m for m in ABLATIONS if m in methods]
    if "cory" not in methods or not present:
        return Claim(name, NOT_RUN, f"needs cory and {' and '.join(ABLATIONS)} on this task.")
    cory_kl = data.stat("kl", **data.standalone(task, "cory", eta))
    ok, text = check_ablation_kl(cory_kl, {m: data.stat("kl", **data.standalone(task, m, eta))
                                           for m in present})
    missing = [m for m in ABLATIONS if m not in present]
    if missing:
        return Claim(name, NOT_RUN, f"{text}; {', '.join(missing)} not run.")
    return Claim.checked(name, ok, text)


def all_claims(data: RunData) -> list[Claim]:
    """Every claim check, per task (and per KL setting in a sweep)."""
    out = []
    for task in data.tasks():
        for eta in data.etas(task):
            group = [claim_reward_kl(data, task, eta), claim_ablations(data, task, eta)]
            if task in MATH_TASKS:
                group.insert(1, claim_peak_decline(data, task, eta))
            if eta is not None:
                for c in group:
                    c.name += f" (η={eta:g})"
            out += group
    if not any(t in MATH_TASKS for t in data.tasks()):
        out.append(Claim("(2) PPO's reward peaks then declines, CORY stays stable", NOT_RUN,
                         f"needs a math task ({', '.join(MATH_TASKS)})."))
    return out


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
    return [f"- {k}: `{config[k]}`" for k in keep if k in config]


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
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(render(data, plots), encoding="utf-8")
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> None:
    """`python -m benchmarks.report RUN_DIR`: rewrite the report of a run folder."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("run_dir")
    print(write_report(parser.parse_args(argv).run_dir))


if __name__ == "__main__":
    main()
