"""The leaderboard: every learner alone and on CORY's structure, on one model's tasks, read
from a pre-stated plan's studies and aggregated as the RL field does (docs/leaderboard.md).

A plan file (TOML) holds the hypotheses `benchmarks.evidence.plan` reads and, beside them:

    [leaderboard]
    model = "smollm2-135m"
    reference = "ppo"                      # P(method > reference), reward at matched KL
    methods = ["ppo", "cory", ...]         # every registered method the studies run
    pairs = [["cory", "ppo"], ...]         # (X on CORY's structure, X alone)
    tuning = "..."                         # the tuning protocol, in words
    [leaderboard.scale]                    # the alone gain that scores 1, per task (stated
    reviews = 0.70                         # before the runs; the base model scores 0)
    [[study]]                              # one study folder per task
    task = "reviews"
    folder = "docs/leaderboard/reviews"
    preset = "leaderboard"                 # its settings and seeds (benchmarks.settings.presets)

A run's score is its alone gain (the mean over evaluation points of the alone reward's rise
over the base model, as every hypothesis reads it) over the task's scale. Only finished runs
count. The aggregates are `benchmarks.evidence.aggregates`'.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tomllib

from agents.learners.registry import registered_methods, resolve_method
from benchmarks.evidence.aggregates import (
    IQM,
    MEAN,
    aggregate,
    normalize,
    performance_profile,
    probability_of_improvement,
)
from benchmarks.evidence.budgets import arm_budget
from benchmarks.evidence.frontier import matched_reward_gap
from benchmarks.evidence.intervals import Interval
from benchmarks.evidence.plan import Arm, Plan, run_data, trajectories
from benchmarks.evidence.records import RunData, no_records
from benchmarks.settings.config import RunSpec, run_weight
from benchmarks.settings.presets import PRESETS
from cory_env import registered_tasks

TAUS = tuple(np.round(np.linspace(-1.0, 3.0, 41), 2))  # performance profiles' thresholds
SPENT = ("optimizer steps", "rows per optimizer step", "generated tokens")


@dataclass(frozen=True)
class Study:
    """One task's study folder, run with a preset's settings (and `options`, more
    `benchmarks.run` options) at its `seeds` (default: the preset's)."""

    task: str
    folder: str
    preset: str
    seeds: tuple[int, ...] = ()
    options: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "seeds", tuple(self.seeds or PRESETS.get(self.preset, {})
                                                .get("seeds", ())))
        object.__setattr__(self, "options", tuple(self.options))

    def unfinished(self, methods: tuple[str, ...]) -> list[tuple[str, int]]:
        """(method, seed) of each planned run of this study without a `done/` marker."""
        have = finished(self)
        return [(m, seed) for m in methods for seed in self.seeds
                if RunSpec(self.task, m, seed).key not in have]

    def run_args(self, methods: tuple[str, ...]) -> list[str]:
        """The `benchmarks.run` options of this study (without --out and --resume)."""
        return ["--preset", self.preset, "--tasks", self.task, "--methods", ",".join(methods),
                "--seeds", ",".join(map(str, self.seeds)), *self.options]


@dataclass(frozen=True)
class Board:
    """A leaderboard plan: its hypotheses (`plan`), methods, pairs, scales and studies."""

    path: Path
    plan: Plan
    model: str
    reference: str
    methods: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]
    tuning: str
    scale: dict[str, float]
    studies: tuple[Study, ...]
    placed: tuple[tuple[str, str, str], ...] = ()  # (task, method, folder) read from elsewhere

    @classmethod
    def load(cls, path: str | Path) -> Board:
        """Read a plan with a [leaderboard] section, naming the bad entry."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no plan file {path}")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path}: not TOML: {err}") from None
        board = data.get("leaderboard")
        if not isinstance(board, dict):
            raise ValueError(f"{path}: no [leaderboard] section")
        for key in ("model", "reference", "methods", "pairs", "tuning", "scale"):
            if key not in board:
                raise ValueError(f"{path}: [leaderboard] is missing {key!r}")
        methods = tuple(board["methods"])
        for m in methods:
            try:
                resolve_method(m)
            except ValueError:
                raise ValueError(f"{path}: [leaderboard] methods: unknown method {m!r}; "
                                 f"registered: {registered_methods()}") from None
        pairs = tuple(tuple(p) for p in board["pairs"])
        for p in pairs:
            if len(p) != 2 or any(m not in methods for m in p):
                raise ValueError(f"{path}: [leaderboard] pairs: {list(p)} must be two of its "
                                 f"methods")
        if board["reference"] not in methods:
            raise ValueError(f"{path}: [leaderboard] reference {board['reference']!r} is not "
                             f"one of its methods")
        studies = read_studies(path, data)
        scale = {str(k): v for k, v in board["scale"].items()}
        for s in studies:
            v = scale.get(s.task)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"{path}: [leaderboard.scale] {s.task} must be a number > 0, "
                                 f"got {v!r}")
        plan = Plan.load(path)
        folders = {(s.folder, s.task) for s in studies}
        for h in plan.hypotheses:
            for arm in (h.a, h.b):
                if (arm.folder, arm.task) not in folders or arm.method not in methods:
                    raise ValueError(f"{path}: hypothesis {h.id}: arm {arm.method!r} on "
                                     f"{arm.task!r} in {arm.folder} is not one of the studies' "
                                     f"methods and folders")
        return cls(path, plan, str(board["model"]), board["reference"], methods, pairs,
                   str(board["tuning"]), scale, tuple(studies))

    def arm(self, study: Study, method: str) -> Arm:
        """A method's runs on a study's task: in the study's folder, or in the folder it was
        placed from (`benchmarks.evidence.placement`)."""
        folder = next((f for t, m, f in self.placed if (t, m) == (study.task, method)),
                      study.folder)
        return Arm(folder, method, study.task)


def read_studies(path: Path, data: dict) -> tuple[Study, ...]:
    """A plan's [[study]] entries, each checked (a ValueError naming the bad one)."""
    studies = []
    for s in data.get("study", []):
        try:
            study = Study(**s)
        except TypeError as err:
            raise ValueError(f"{path}: [[study]] {s}: {err}") from None
        if study.task not in registered_tasks():
            raise ValueError(f"{path}: [[study]]: unknown task {study.task!r}; "
                             f"registered: {registered_tasks()}")
        if study.preset not in PRESETS:
            raise ValueError(f"{path}: [[study]] {study.task}: unknown preset "
                             f"{study.preset!r}; presets: {sorted(PRESETS)}")
        if not all(isinstance(x, int) for x in study.seeds) or len(study.seeds) < 2:
            raise ValueError(f"{path}: [[study]] {study.task}: seeds must be two whole "
                             f"numbers or more, got {list(study.seeds)!r}")
        if study.task not in PRESETS[study.preset].get("tasks", [study.task]):
            raise ValueError(f"{path}: [[study]] {study.task}: preset {study.preset!r} "
                             f"runs {PRESETS[study.preset].get('tasks')}, not {study.task!r}")
        studies.append(study)
    if not studies:
        raise ValueError(f"{path}: no [[study]]")
    return tuple(studies)


@dataclass
class Progress:
    """Finished runs against planned, per study."""

    done: dict[str, int]
    planned: dict[str, int]

    @property
    def complete(self) -> bool:
        """Every planned run finished."""
        return all(self.done[k] >= self.planned[k] for k in self.planned)

    def line(self) -> str:
        """One line: each study's count and the whole plan's."""
        parts = [f"{k} {self.done[k]}/{self.planned[k]}" for k in self.planned]
        return (f"{sum(self.done.values())} of {sum(self.planned.values())} runs finished "
                f"({', '.join(parts)})")


def finished(study: Study) -> set[str]:
    """The run keys of a study folder with a `done/` marker."""
    done = Path(study.folder) / "done"
    return {p.name for p in done.iterdir()} if done.is_dir() else set()


def progress(board: Board) -> Progress:
    """How many of each study's planned runs (methods x seeds) have finished."""
    done, planned = {}, {}
    for s in board.studies:
        planned[s.task] = len(board.methods) * len(s.seeds)
        done[s.task] = planned[s.task] - len(s.unfinished(board.methods))
    return Progress(done, planned)


def missing_runs(board: Board) -> list[str]:
    """The planned runs without a `done/` marker, as "task method seed N"."""
    return [f"{s.task} {m} seed {seed}" for s in board.studies
            for m, seed in s.unfinished(board.methods)]


@dataclass
class Cost:
    """The plan's CPU time: spent so far by its records and an estimate of what is left."""

    spent_s: float
    left_s: float
    scaled: list[str]  # "task method": no iteration timed yet, its cost borrowed (run_weight)
    untimed: list[str]  # tasks with no timed iteration at all (their runs are not in left_s)

    def line(self, workers: int = 1) -> str:
        """One line: CPU-hours spent and left, and the wall hours at `workers` runs at once."""
        hours = self.left_s / 3600
        left = f"{hours:.1f} CPU-hours left" + (
            f" ({hours / workers:.1f} h at {workers} runs at once)" if workers > 1 else "")
        left = (f"at least {left}, not counting {', '.join(self.untimed)} (not timed yet)"
                if self.untimed else f"about {left}")
        if self.scaled:
            more = ", ..." if len(self.scaled) > 3 else ""
            n = len(self.scaled)
            left += (f"; {n} method{'s' * (n > 1)} not timed yet, costed as another's scaled by "
                     f"models x episodes ({', '.join(self.scaled[:3])}{more})")
        return f"{self.spent_s / 3600:.1f} CPU-hours spent; {left}"


def cpu_cost(board: Board) -> Cost:
    """What the plan's runs have cost (the sum of their records' `time_cpu_s`) and what the
    unfinished ones will: each iteration left at its method's mean CPU seconds per iteration
    on that task, or, for a method not timed there, the most-timed method's scaled by
    `run_weight`."""
    spent = left = 0.0
    scaled, untimed = [], []
    for s in board.studies:
        folder = Path(s.folder)
        data = RunData.load(folder) if no_records(folder) is None else None
        cpu: dict[tuple[str, int], float] = {}
        its: dict[tuple[str, int], set[int]] = {}
        for r in data.rows if data else []:
            if r["task"] != s.task or r.get("swept_kl_coef") is not None:
                continue
            key = (r["method"], int(r["seed"]))
            cpu[key] = cpu.get(key, 0.0) + float(r.get("time_cpu_s", 0.0))
            its.setdefault(key, set()).add(int(r["iteration"]))
        spent += sum(cpu.values())
        unfinished = s.unfinished(board.methods)
        if not unfinished:
            continue
        counts = {m: sum(len(v) for k, v in its.items() if k[0] == m and cpu[k] > 0)
                  for m in board.methods}  # timed iterations
        per_it = {m: sum(c for k, c in cpu.items() if k[0] == m) / n
                  for m, n in counts.items() if n}
        if not per_it:
            untimed.append(s.task)
            continue
        timed = max(per_it, key=counts.get)
        total = int(data.config.get("train", {}).get("iterations", 0))
        todo = dict.fromkeys(board.methods, 0)
        for m, seed in unfinished:
            todo[m] += max(0, total - len(its.get((m, seed), ())))
        for m, n in todo.items():
            if n and m not in per_it:
                scaled.append(f"{s.task} {m}")
            left += n * per_it.get(m, per_it[timed] * run_weight(m) / run_weight(timed))
    return Cost(spent, left, scaled, untimed)


@dataclass
class Entry:
    """One method's line of the leaderboard."""

    method: str
    scores: dict[str, list[float]]  # task -> normalized score per finished seed
    iqm: tuple[float, float, float] | None
    mean: tuple[float, float, float] | None
    p_over_reference: tuple[float, float, float] | None
    final_kl: float | None
    matched_gap: dict[str, Interval | None]  # task -> reward at matched KL minus the reference
    spent: dict[str, float]  # per model, averaged over tasks and seeds
    cpu_s: float | None  # a run's CPU seconds (all its models), averaged over tasks and seeds

    @property
    def seeds(self) -> int:
        """Finished seeds over every task."""
        return sum(len(v) for v in self.scores.values())


def scores(board: Board, method: str, cache: dict) -> dict[str, list[float]]:
    """task -> the method's normalized score of each finished seed (seed order)."""
    out = {}
    for s in board.studies:
        ts = trajectories(board.arm(s, method), cache)
        out[s.task] = [normalize(ts[seed].mean_gain(), board.scale[s.task]) for seed in sorted(ts)]
    return out


def _final_kl(board: Board, method: str, cache: dict) -> float | None:
    """The mean over tasks and seeds of the last alone point's ΣKL to the reference model."""
    kls = [float(t.kl[-1]) for s in board.studies
           for t in trajectories(board.arm(s, method), cache).values()]
    return float(np.mean(kls)) if kls else None


def _matched_gap(board: Board, study: Study, method: str, cache: dict) -> Interval | None:
    """The method's alone reward at matched ΣKL minus the reference's, paired by seed."""
    a = trajectories(board.arm(study, method), cache)
    b = trajectories(board.arm(study, board.reference), cache)
    seeds = sorted(set(a) & set(b))
    if method == board.reference or len(seeds) < 2:
        return None
    gap, _ = matched_reward_gap([a[s] for s in seeds], [b[s] for s in seeds])
    return gap


def _spent(board: Board, method: str, cache: dict) -> tuple[dict[str, float], float | None]:
    """The method's budgets per model and a run's CPU seconds, averaged over its tasks."""
    budgets, cpu = [], []
    for s in board.studies:
        folder = Path(board.arm(s, method).folder)
        if not (folder / "alone.jsonl").exists():
            continue
        data = run_data(folder, cache)
        seeds = set(trajectories(board.arm(s, method), cache))
        if not seeds:
            continue
        budgets.append(arm_budget(data, s.task, method, seeds=seeds))
        cpu += run_cpu_seconds(data, s.task, method, seeds)
    spent = {k: float(np.mean([b[k] for b in budgets if k in b])) for k in SPENT
             if any(k in b for b in budgets)}
    return spent, (float(np.mean(cpu)) if cpu else None)


def run_cpu_seconds(data: RunData, task: str, method: str, seeds: set[int]) -> list[float]:
    """Each seed's CPU seconds, where recorded: the sum of `time_cpu_s` over its iteration
    records (each agent's record holds its share of the process's CPU time since the last
    ones: training, alone evaluations and checkpoints)."""
    out = []
    for seed in sorted(seeds):
        mine = [float(r["time_cpu_s"]) for r in data.rows if r["task"] == task
                and r["method"] == method and int(r["seed"]) == seed
                and r.get("swept_kl_coef") is None and "time_cpu_s" in r]
        if mine:
            out.append(sum(mine))
    return out


def entries(board: Board, cache: dict | None = None) -> list[Entry]:
    """Every method's line, best IQM first (methods without finished runs last; records read
    through `cache`, a fresh one when None)."""
    cache = {} if cache is None else cache
    out = []
    for m in board.methods:
        sc = scores(board, m, cache)
        full = all(len(v) >= 2 for v in sc.values())
        spent, cpu = _spent(board, m, cache)
        out.append(Entry(m, sc, aggregate(sc, IQM) if full else None,
                         aggregate(sc, MEAN) if full else None, None,
                         _final_kl(board, m, cache),
                         {s.task: _matched_gap(board, s, m, cache) for s in board.studies},
                         spent, cpu))
    ref = next(e for e in out if e.method == board.reference)
    out = [dataclasses.replace(e, p_over_reference=improvement(e, ref)) if e is not ref else e
           for e in out]
    return sorted(out, key=lambda e: (e.iqm is None, -(e.iqm[0] if e.iqm else 0.0), e.method))


def improvement(a: Entry, b: Entry) -> tuple[float, float, float] | None:
    """P(a run of `a` beats a run of `b`) with its interval, or None until both have two
    finished seeds on every task (an IQM)."""
    return probability_of_improvement(a.scores, b.scores) if a.iqm and b.iqm else None


def pair_improvements(board: Board, table: list[Entry]) -> list[tuple[str, str, tuple | None]]:
    """(cory-X, X, P(cory-X > X) with its interval, or None before both have runs)."""
    by = {e.method: e for e in table}
    return [(a, b, improvement(by[a], by[b])) for a, b in board.pairs]


def profiles(table: list[Entry]) -> dict[str, list[tuple[float, float, float]]]:
    """method -> its performance profile over TAUS (methods with finished runs on every
    task)."""
    return {e.method: performance_profile(e.scores, TAUS) for e in table if e.iqm is not None}


def pinned(folder: Path) -> dict | None:
    """The pin a leaderboard's runs were started under (commit, plan hash), or None."""
    path = folder / "pin.json"
    return json.loads(path.read_text()) if path.is_file() else None


def is_finite(x: float | None) -> bool:
    """A number that is not NaN or infinite."""
    return x is not None and math.isfinite(x)


__all__ = ["Board", "Entry", "Progress", "Study", "entries", "improvement", "missing_runs",
           "pair_improvements", "profiles", "progress", "pinned", "is_finite"]
