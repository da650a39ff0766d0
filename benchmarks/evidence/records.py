"""A benchmark run's records as numbers: lookups, per-seed curves, finals, mean ± std.

Everything here reads plain records (the rows of ``metrics.jsonl`` and ``alone.jsonl``) and
never touches a model. Conventions (printed in the report too):

* A **final** value is the mean of the last ``window`` iterations of one seed's curve; tables
  show mean ± std over seeds (sample std, ddof=1; 0 for a single seed).
* In-training numbers are per role; a two-agent method's models are also shown one by one,
  by agent name (``llm_0``, ``llm_1``: the paper's LLM1 and LLM2), in tables and plots alike.
* A method's **alone trajectory** of a seed is its models' alone-evaluation points
  (``alone.jsonl``), averaged over its models at each point; the claims read these.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from benchmarks.evidence.stats import smooth
from cory_common.runlog import packed_only, read_jsonl
from cory_env import is_exact_match

FORMAT = 6  # of run_config.json and the records beside it (6: alone.jsonl names the `agent`)


def check_format(config: dict, where) -> None:
    """Refuse a study folder written in another format, naming both and the way on (formats 4
    and 5 are rewritten once by `python -m benchmarks.migrate`; 3 recorded the training
    combined reward at the current KL coefficient, 2 and earlier used settings renamed since)."""
    found = config.get("format")
    if found in (4, 5):
        folder = Path(where).parent
        what = "the KL coefficient's old names" if found == 4 else "alone.jsonl's `model` field"
        raise ValueError(f"{where} is study-folder format {found} ({what}); rewrite it once "
                         f"with python -m benchmarks.migrate {folder}")
    if found != FORMAT:
        raise ValueError(f"{where} is study-folder format {found}, this version reads format "
                         f"{FORMAT} only: rerun it, or read it with the version that wrote it")


def read_json(path: Path) -> dict:
    """A folder's JSON object file ({} where it is missing); a ValueError naming a broken one."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a {type(data).__name__}, not a JSON object")
    return data


def check_records(records: list[dict], path: Path, keys: tuple[str, ...]) -> None:
    """A ValueError naming the first record of a records file that lacks a run record's keys."""
    for number, record in enumerate(records, 1):
        if missing := [k for k in keys if k not in record]:
            shown = json.dumps(record)
            shown = shown if len(shown) <= 120 else shown[:117] + "..."
            raise ValueError(f"{path}: record {number} is not a run record, it lacks "
                             f"{', '.join(missing)}: {shown}")


def gzipped_records(folder: str | os.PathLike) -> str | None:
    """Why a folder's records cannot be appended to or rewritten (metrics.jsonl or alone.jsonl
    kept only gzipped), or None."""
    for name in ("metrics.jsonl", "alone.jsonl"):
        if packed := packed_only(Path(folder) / name):
            return f"{packed} is gzipped; run `gunzip {packed}` first"
    return None


def no_records(folder: str | os.PathLike) -> str | None:
    """Why a path is not a study folder (no run_config.json, metrics.jsonl or its gzipped copy),
    or None if it is."""
    names = ("run_config.json", "metrics.jsonl", "metrics.jsonl.gz")
    if any((Path(folder) / name).is_file() for name in names):
        return None
    return (f"{str(folder)!r} holds no run records (no run_config.json or metrics.jsonl): "
            f"give a folder written by python -m benchmarks.run")


def rotation_of(record: dict) -> int:
    """A record's role rotation (0 where a record has none: one agent, or a synthetic one)."""
    return int(record.get("rotation", 0))


def position_of(record: dict) -> int:
    """A training record's chain position (records from before positions were written: 0 for
    the pioneer, 1 otherwise)."""
    return int(record.get("position", int(record.get("role") != "pioneer")))


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
        if self.n == 1:  # one seed has no spread to show
            return f"{fmt(self.mean)} (1 seed)"
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


@dataclass(frozen=True)
class Trajectory:
    """One seed's alone-evaluation points of a method (or model), in iteration order."""

    iterations: np.ndarray
    kl: np.ndarray
    reward: np.ndarray
    combined: np.ndarray

    @classmethod
    def of(cls, records: list[dict]) -> Trajectory:
        """The points of alone records, averaged over models at each iteration."""
        by_it: dict[int, list[dict]] = defaultdict(list)
        for r in records:
            by_it[int(r["iteration"])].append(r)
        its = sorted(by_it)
        mean = lambda f: np.array([sum(r[f] for r in by_it[i]) / len(by_it[i])  # noqa: E731
                                   for i in its], dtype=np.float64)
        return cls(np.array(its, dtype=np.float64), mean("kl"), mean("task_reward"),
                   mean("combined_reward"))

    def mean_gain(self) -> float:
        """The mean reward over the points after the base minus the base's own (first) point
        (NaN with one point): what the learning gate tests and the report's first line shows."""
        return float(np.mean(self.reward[1:]) - self.reward[0]) if len(self.reward) > 1 \
            else math.nan

    def smoothed(self) -> Trajectory:
        """The same points with kl, reward and combined reward smoothed (`stats.smooth`)."""
        return replace(self, kl=smooth(self.kl), reward=smooth(self.reward),
                       combined=smooth(self.combined))


class RunData:
    """A study folder's records with the lookups the report needs."""

    def __init__(self, rows: list[dict], evals: list[dict] | None = None,
                 config: dict | None = None, window: int | None = None,
                 mechanism: dict | None = None):
        self.rows, self.evals, self.config = rows, evals or [], config or {}
        self.window = window or int(self.config.get("final_window", 5))
        self.mechanism = mechanism or {}  # task -> the model's measured mechanism
        self._trajectories: dict[tuple, dict[int, Trajectory]] = {}

    @classmethod
    def load(cls, folder: str | os.PathLike) -> RunData:
        """Read metrics.jsonl, alone.jsonl, run_config.json and mechanism.json of a folder."""
        folder = Path(folder)
        config = read_json(folder / "run_config.json")
        if config:
            check_format(config, folder / "run_config.json")
        rows, evals = read_jsonl(folder / "metrics.jsonl"), read_jsonl(folder / "alone.jsonl")
        check_records(rows, folder / "metrics.jsonl", ("task", "method", "seed", "iteration"))
        check_records(evals, folder / "alone.jsonl", ("task", "method", "seed", "iteration",
                                                      "agent"))
        return cls(rows, evals, config, mechanism=read_json(folder / "mechanism.json"))

    def exact_match(self, task: str) -> bool:
        """Whether the task's reward is exact-match (registered so, or pass@k recorded)."""
        return is_exact_match(task) or any("pass@1" in e for e in select(self.evals, task=task))

    def tasks(self) -> list[str]:
        """Tasks in run order."""
        return ordered(r["task"] for r in self.rows)

    def kl_coefs(self, task: str) -> list:
        """KL-coefficient settings run on a task (None = the preset's own)."""
        return ordered(r["swept_kl_coef"] for r in select(self.rows, task=task))

    def methods(self, task: str, kl_coef=None) -> list[str]:
        """Methods run on a task at one kl_coef."""
        return ordered(r["method"] for r in select(self.rows, task=task, swept_kl_coef=kl_coef))

    def agents(self, task: str, method: str) -> list[str]:
        """The method's models (llm_0, and llm_1 .. llm_{K-1} for multi-agent methods)."""
        return sorted(ordered(r["agent"] for r in select(self.rows, task=task, method=method)),
                      key=lambda a: int(a.rsplit("_", 1)[-1]) if a[-1].isdigit() else 0)

    def roles(self, task: str, method: str, kl_coef=None) -> list[str]:
        """The method's chain positions by role name, pioneer first."""
        rows = select(self.rows, task=task, method=method, swept_kl_coef=kl_coef)
        at = {r["role"]: position_of(r) for r in rows}
        return sorted(at, key=at.get)

    def two_agent(self, task: str, method: str) -> bool:
        """True when the method trains two models."""
        return len(self.agents(task, method)) > 1

    def stat(self, field: str, **match) -> Stat:
        """Final-value mean ± std over seeds."""
        return final_stat(self.rows, field, self.window, **match)

    def trajectories(self, task: str, method: str, kl_coef, agent: str | None = None,
                     complete: bool = True) -> dict[int, Trajectory]:
        """seed -> the method's alone trajectory (mean over its models, or the model `agent`). A
        seed with fewer points than the method's longest (still running, stopped early or a
        record lost) is left out unless `complete` is False."""
        key = (task, method, kl_coef, agent, id(self.evals), len(self.evals))
        if key not in self._trajectories:
            match = {"task": task, "method": method, "swept_kl_coef": kl_coef}
            if agent is not None:
                match["agent"] = agent
            rows = select(self.evals, **match)
            self._trajectories[key] = {s: Trajectory.of(select(rows, seed=s))
                                       for s in ordered(r["seed"] for r in rows)}
        out = self._trajectories[key]
        full = max((len(t.iterations) for t in out.values()), default=0)
        return {s: t for s, t in out.items() if not complete or len(t.iterations) == full}

    def alone_agents(self, task: str, method: str, kl_coef) -> list[str]:
        """The method's models (by agent name) that were evaluated alone."""
        return sorted(ordered(r["agent"] for r in select(self.evals, task=task, method=method,
                                                         swept_kl_coef=kl_coef)))

    def alone_reward_scale(self, task: str, methods: Sequence[str] | None = None) -> float:
        """The task's reward scale: 1 for exact-match tasks (rewards in [0, 1]), else the span
        of the alone rewards recorded on it by `methods` (default: every method), every seed and
        point."""
        if self.exact_match(task):
            return 1.0
        values = [r["task_reward"] for r in select(self.evals, task=task)
                  if methods is None or r["method"] in methods]
        return float(max(values) - min(values)) if values else 0.0

    def report_kl_coef(self, task: str) -> float:
        """The KL coefficient of the alone combined reward on a task (the records' own)."""
        coefs = ordered(r.get("report_kl_coef") for r in select(self.evals, task=task))
        return float(coefs[0]) if coefs and coefs[0] is not None else float("nan")

    def series(self, task: str, method: str, kl_coef) -> list[tuple[str, dict]]:
        """(label, match) of each model of a method, named by its agent (llm_0, llm_1, ...) as
        in every table and plot."""
        if not self.two_agent(task, method):
            return [(method, {"task": task, "method": method, "swept_kl_coef": kl_coef})]
        return [(f"{method} {a}", {"task": task, "method": method, "swept_kl_coef": kl_coef,
                                   "agent": a})
                for a in self.agents(task, method)]
