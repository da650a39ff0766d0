"""A pre-stated plan of hypotheses, read from its TOML file, and each hypothesis's row computed
from the records it names (the test, its p, Holm's correction, budget flags), with the seeds
each would need. `python -m benchmarks.why` renders the rows and checks a summary against them;
its docstring states the plan's format and the rules.
"""

from __future__ import annotations

import json
import math
from collections.abc import Set
from dataclasses import dataclass, field, replace
from pathlib import Path

import tomllib

from agents.learners.registry import registered_methods, resolve_method
from benchmarks.evidence.budgets import arm_budget, differing
from benchmarks.evidence.intervals import (
    ALPHA,
    POWER,
    holm,
    mean_interval,
    t_quantile,
    welch_interval,
)
from benchmarks.evidence.records import RunData
from cory_env import registered_tasks

QUANTITIES = ("alone_gain", "final_gain")
TESTS = ("difference", "superiority", "equivalence")
PAIRINGS = ("paired", "welch")


@dataclass(frozen=True)
class Arm:
    """One side of a contrast: a method's runs in a folder (read up to `iterations`)."""

    folder: str
    method: str
    task: str = "reviews"
    iterations: int | None = None  # read only the alone points at or before this iteration

    def unknown(self) -> str | None:
        """Why the arm's method or task is neither registered nor in its folder's run_config.json
        (a plug-in's name), or None: a misspelt name would otherwise read as "not run"."""
        config = Path(self.folder) / "run_config.json"
        ran = json.loads(config.read_text()) if config.is_file() else {}
        try:
            resolve_method(self.method)
        except ValueError:
            if self.method not in ran.get("methods", []):
                return (f"unknown method {self.method!r}; registered: {registered_methods()}"
                        f" (or one that {config} lists)")
        if self.task not in registered_tasks() and self.task not in ran.get("tasks", []):
            return (f"unknown task {self.task!r}; registered: {registered_tasks()} (or one that "
                    f"{config} lists)")
        return None

    def label(self) -> str:
        """How the table names it."""
        cut = f" to it. {self.iterations}" if self.iterations else ""
        return f"`{self.method}`{cut} ({Path(self.folder).name})"


@dataclass(frozen=True)
class Hypothesis:
    """One planned contrast a − b (see the module docstring)."""

    id: str
    claim: str
    a: Arm
    b: Arm
    quantity: str = "alone_gain"
    test: str = "difference"
    pairing: str = "paired"
    direction: str = "greater"
    margin: float = 0.25
    seeds: int = 10
    factor_budgets: tuple[str, ...] = ()
    pilot: str | None = None  # a first-pass folder holding both arms' methods (for --power)

    def __post_init__(self):
        for name, value, allowed in (("quantity", self.quantity, QUANTITIES),
                                     ("test", self.test, TESTS),
                                     ("pairing", self.pairing, PAIRINGS),
                                     ("direction", self.direction, ("greater", "less"))):
            if value not in allowed:
                raise ValueError(f"hypothesis {self.id}: {name} must be one of {allowed}, "
                                 f"got {value!r}")
        if not self.margin > 0:
            raise ValueError(f"hypothesis {self.id}: margin must be > 0, got {self.margin!r}")
        if not (isinstance(self.seeds, int) and self.seeds >= 2):
            raise ValueError(f"hypothesis {self.id}: seeds must be a whole number >= 2 (an "
                             f"interval needs two), got {self.seeds!r}")
        for arm in (self.a, self.b):
            if arm.iterations is not None and not (isinstance(arm.iterations, int)
                                                   and arm.iterations > 0):
                raise ValueError(f"hypothesis {self.id}: arm {arm.method!r}: iterations must be "
                                 f"a whole number > 0, got {arm.iterations!r}")


@dataclass
class Plan:
    """A pre-stated plan: its hypotheses and when it was written."""

    written: str
    hypotheses: list[Hypothesis] = field(default_factory=list)
    alpha: float = ALPHA

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Read a plan file, naming the bad entry."""
        try:
            data = tomllib.loads(Path(path).read_text())
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path}: not TOML: {err}") from None
        hyps = []
        for h in data.get("hypothesis", []):
            h = dict(h)
            where = f"{path}: hypothesis {h.get('id', '?')}"
            try:
                a, b = Arm(**h.pop("a")), Arm(**h.pop("b"))
                h["factor_budgets"] = tuple(h.get("factor_budgets", ()))
                hyps.append(Hypothesis(a=a, b=b, **h))
            except KeyError as err:
                raise ValueError(f"{where}: missing {err}") from None
            except TypeError as err:
                raise ValueError(f"{where}: {err}") from None
            except ValueError as err:  # Hypothesis's own message names it
                raise ValueError(f"{path}: {err}") from None
            for arm in (a, b):
                if why := arm.unknown():
                    raise ValueError(f"{where}: {why}")
        ids = [h.id for h in hyps]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{path}: hypothesis ids repeat: {ids}")
        alpha = data.get("alpha", ALPHA)
        if not (isinstance(alpha, float) and 0 < alpha < 1):
            raise ValueError(f"{path}: alpha must be a number between 0 and 1, got {alpha!r}")
        return cls(str(data.get("written", "")), hyps, alpha)


def per_seed(arm: Arm, quantity: str, cache: dict) -> dict[int, float]:
    """seed -> the arm's quantity (empty when the folder or the method has no records)."""
    folder = Path(arm.folder)
    if not (folder / "alone.jsonl").exists():
        return {}
    data = cache.setdefault(str(folder), RunData.load(folder))
    out = {}
    unfinished = running(folder, data, arm)
    for seed, t in data.trajectories(arm.task, arm.method, None).items():
        if int(seed) in unfinished:
            continue
        if arm.iterations:  # the points at or before it
            keep = t.iterations <= arm.iterations
            t = replace(t, iterations=t.iterations[keep], kl=t.kl[keep],
                        reward=t.reward[keep], combined=t.combined[keep])
        if len(t.reward) < 2:
            continue
        out[int(seed)] = t.mean_gain() if quantity == "alone_gain" \
            else float(t.reward[-1] - t.reward[0])
    return out


def alone_records(data: RunData, arm: Arm) -> list[dict]:
    """The arm's alone-evaluation records (its task and method, every seed, no KL sweep: the
    records `per_seed` reads)."""
    return [r for r in data.evals if r["task"] == arm.task and r["method"] == arm.method
            and r.get("swept_kl_coef") is None]


def running(folder: Path, data: RunData, arm: Arm) -> set[int]:
    """Seeds of the arm whose run has not finished: in a folder that keeps run markers (done/
    or ckpt/, as `benchmarks.run` writes them), those without `done/<run>`. Their records so far
    never count, so no row can be tested while a run is still writing its points."""
    if not ((folder / "done").is_dir() or (folder / "ckpt").is_dir()):
        return set()
    runs = {int(r["seed"]): str(r.get("run")) for r in alone_records(data, arm)}
    return {seed for seed, run in runs.items() if not (folder / "done" / run).exists()}


def made_with(data: RunData, arm: Arm, name: str, seeds: Set[int]) -> list[str]:
    """The distinct `commit` or `draws` values of an arm's alone records of `seeds`
    ("unrecorded" for records written before they were kept)."""
    rows = [r for r in alone_records(data, arm) if int(r["seed"]) in seeds]
    cut = 12 if name == "commit" else None
    return sorted({str(r.get(name) or "unrecorded")[:cut] for r in rows})


@dataclass
class Row:
    """One hypothesis's estimate, test and verdict."""

    hypothesis: Hypothesis
    n: int
    estimate: float = math.nan
    low: float = math.nan
    high: float = math.nan
    p: float = 1.0
    se: float = math.nan
    p_holm: float = 1.0
    flags: list[str] = field(default_factory=list)
    seeds: tuple[frozenset[int], frozenset[int]] = (frozenset(), frozenset())  # counted, per arm

    @property
    def complete(self) -> bool:
        """Whether the plan's seeds are all in (a row is tested only then: no peeking)."""
        return self.n >= self.hypothesis.seeds

    def verdict(self, alpha: float) -> str:
        """The verdict at the family-wise level alpha (Holm)."""
        h = self.hypothesis
        if self.n < 2:
            return f"not run ({self.n} of {h.seeds} seeds)"
        if not self.complete:
            return f"incomplete ({self.n} of {h.seeds} seeds): not tested"
        hides = max(abs(self.low), abs(self.high))
        if self.p_holm < alpha:
            return {"difference": "a > b" if self.estimate > 0 else "a < b",
                    "superiority": "supported",
                    "equivalence": f"equivalent within ±{h.margin:g}"}[h.test]
        if h.test == "equivalence":
            return f"not shown equivalent (the interval reaches {hides:.2f})"
        if h.test == "superiority":  # only the claimed direction's side of the interval
            hides = self.high if h.direction == "greater" else -self.low
            if hides <= 0:
                side = "below" if h.direction == "greater" else "above"
                return f"undecided (the whole interval lies {side} 0, against the hypothesis)"
        return f"undecided (could hide an effect of up to {hides:.2f})"


def contrast(h: Hypothesis, cache: dict) -> Row:
    """Estimate, 95% interval and the test's p-value of a − b, over each arm's finished seeds
    (paired: the seeds both arms have)."""
    a, b = per_seed(h.a, h.quantity, cache), per_seed(h.b, h.quantity, cache)
    if h.pairing == "paired":
        common = frozenset(a) & frozenset(b)
        seeds = (common, common)
        iv = mean_interval([a[s] - b[s] for s in sorted(common)])
    else:
        seeds = (frozenset(a), frozenset(b))
        iv = welch_interval(list(a.values()), list(b.values()))
    if iv.n < 2:
        return Row(h, iv.n, seeds=seeds)
    p = {"difference": 2 * min(iv.p_above(0), iv.p_below(0)),
         "superiority": iv.p_above(0) if h.direction == "greater" else iv.p_below(0),
         "equivalence": max(iv.p_above(-h.margin), iv.p_below(h.margin))}[h.test]
    return Row(h, iv.n, iv.mean, iv.low, iv.high, min(p, 1.0), se=iv.se, seeds=seeds)


def evaluate(plan: Plan) -> list[Row]:
    """Every hypothesis's row, Holm-adjusted over the whole family, budgets checked."""
    cache: dict = {}
    rows = [contrast(h, cache) for h in plan.hypotheses]
    for row, adjusted in zip(rows, holm([r.p if r.complete else 1.0 for r in rows])):
        row.p_holm = adjusted
        h = row.hypothesis
        if row.n >= 2:
            arms = [(cache[str(Path(arm.folder))], arm, seeds) for arm, seeds in
                    zip((h.a, h.b), row.seeds)]
            ba, bb = (arm_budget(d, arm.task, arm.method, seeds=seeds,
                                 iterations=arm.iterations) for d, arm, seeds in arms)
            row.flags = differing(ba, bb, skip=h.factor_budgets)
            for name in ("commit", "draws"):
                made = [made_with(d, arm, name, seeds) for d, arm, seeds in arms]
                if made[0] != made[1] or len(made[0]) > 1:
                    row.flags.append(f"{name} {' + '.join(made[0])} vs {' + '.join(made[1])}")
    return rows


def seeds_needed(sd: float, h: Hypothesis, expected: float = 0.0, alpha: float = ALPHA,
                 top: int = 200) -> int | None:
    """Seeds for 80% power at `alpha` with per-seed spread `sd`: to detect `margin`
    (difference, superiority), or to show equivalence within ±margin when the true gap is
    `expected`."""
    for n in range(3, top + 1):
        se = sd / math.sqrt(n)
        if h.test == "equivalence":
            ok = (t_quantile(n - 1, 1 - alpha) + t_quantile(n - 1, 1 - (1 - POWER) / 2)) * se \
                <= h.margin - abs(expected)
        else:
            q = 1 - alpha / 2 if h.test == "difference" else 1 - alpha
            ok = (t_quantile(n - 1, q) + t_quantile(n - 1, POWER)) * se <= h.margin
        if ok:
            return n
    return None


def power_lines(plan: Plan) -> list[str]:
    """Each hypothesis's seeds from the spread of its contrast in its pilot folder, at the
    plan's alpha and at alpha / m (Holm's first step over the m hypotheses)."""
    cache: dict = {}
    out, strict = [], plan.alpha / max(1, len(plan.hypotheses))
    for h in plan.hypotheses:
        if h.pilot is None:
            out.append(f"{h.id}: no pilot folder: the plan's {h.seeds} seeds stand")
            continue
        pilot = replace(h, a=replace(h.a, folder=h.pilot, iterations=None),
                        b=replace(h.b, folder=h.pilot, iterations=None))
        r = contrast(pilot, cache)
        if r.n < 2:
            out.append(f"{h.id}: {h.pilot} lacks the arms: the plan's {h.seeds} seeds stand")
            continue
        sd = r.se * math.sqrt(r.n)
        gap = r.estimate if h.test == "equivalence" else 0.0
        need = [seeds_needed(sd, h, gap, a) or "> 200" for a in (plan.alpha, strict)]
        out.append(f"{h.id}: pilot {r.estimate:+.2f}, per-seed sd {sd:.3f} over {r.n} seeds, "
                   f"margin {h.margin:g}: 80% power needs {need[0]} seeds at alpha "
                   f"{plan.alpha:g}, {need[1]} at {strict:.2g} (planned {h.seeds})")
    return out
