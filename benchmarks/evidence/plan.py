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
from scipy.stats import nct as _nct

from agents.learners.registry import registered_methods, resolve_method
from benchmarks.evidence.budgets import arm_budget, differing
from benchmarks.evidence.frontier import matched_reward_gap
from benchmarks.evidence.intervals import (
    ALPHA,
    POWER,
    Interval,
    holm,
    mean_interval,
    t_quantile,
    welch_interval,
)
from benchmarks.evidence.records import RunData, Trajectory
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
    sd: float | None = None  # the per-seed spread --power assumes where no pilot measures it

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


def run_data(folder: str | Path, cache: dict) -> RunData:
    """A study folder's records, read once per `cache` (keyed by the folder's path)."""
    key = str(Path(folder))
    if key not in cache:
        cache[key] = RunData.load(Path(folder))
    return cache[key]


def trajectories(arm: Arm, cache: dict) -> dict[int, Trajectory]:
    """seed -> the arm's alone trajectory of a finished run, cut at its iterations, with two
    points at least (empty when the folder or the method has no records)."""
    folder = Path(arm.folder)
    if not (folder / "alone.jsonl").exists():
        return {}
    data = run_data(folder, cache)
    out = {}
    unfinished = running(folder, data, arm)
    for seed, t in data.trajectories(arm.task, arm.method, None).items():
        if int(seed) in unfinished:
            continue
        if arm.iterations:  # the points at or before it
            keep = t.iterations <= arm.iterations
            t = replace(t, iterations=t.iterations[keep], kl=t.kl[keep],
                        reward=t.reward[keep], combined=t.combined[keep])
        if len(t.reward) >= 2:
            out[int(seed)] = t
    return out


def per_seed(arm: Arm, quantity: str, cache: dict) -> dict[int, float]:
    """seed -> the arm's quantity (empty when the folder or the method has no records)."""
    return {seed: t.mean_gain() if quantity == "alone_gain" else float(t.reward[-1] - t.reward[0])
            for seed, t in trajectories(arm, cache).items()}


def frontier_gap(h: Hypothesis, seeds: Set[int], cache: dict) -> Interval | None:
    """a − b in alone reward at matched ΣKL (the KL levels every seed of both reached), paired
    by seed; exploratory: no hypothesis of the plan names it. None for unpaired arms."""
    if h.pairing != "paired" or len(seeds) < 2:
        return None
    a, b = trajectories(h.a, cache), trajectories(h.b, cache)
    ordered_seeds = sorted(s for s in seeds if s in a and s in b)
    gap, _ = matched_reward_gap([a[s] for s in ordered_seeds], [b[s] for s in ordered_seeds])
    return gap


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
    dof: float = math.nan
    step_alpha: float = ALPHA  # the level its own p must reach for Holm to decide it
    frontier: Interval | None = None  # a - b in reward at matched KL (exploratory)
    structure: list[str] = field(default_factory=list)  # how the arms' methods differ

    def test_interval(self) -> tuple[float, float]:
        """The interval consistent with this row's test at the level Holm's procedure asks of
        its p (`step_alpha`): (1 - 2 step) for an equivalence test, (1 - step) two-sided for a
        difference, the one-sided bound (the other side infinite) for superiority."""
        h, a = self.hypothesis, self.step_alpha
        if h.test == "superiority":
            half = t_quantile(self.dof, 1 - a) * self.se
            return ((self.estimate - half, math.inf) if h.direction == "greater"
                    else (-math.inf, self.estimate + half))
        half = t_quantile(self.dof, 1 - (a if h.test == "equivalence" else a / 2)) * self.se
        return self.estimate - half, self.estimate + half

    def deciding_margin(self) -> float:
        """An equivalence row: the smallest margin its test would be decided at, at its Holm
        step (NaN for the other tests)."""
        if self.hypothesis.test != "equivalence" or self.n < 2:
            return math.nan
        low, high = self.test_interval()
        return max(abs(low), abs(high))

    def seeds_to_decide(self) -> int | None:
        """Seeds that would decide an undecided row with 80% power at the level Holm asks of it,
        the per-seed spread as observed and the effect as estimated (None: more than 200, or
        the estimate lies against a one-sided hypothesis)."""
        h = self.hypothesis
        sd = self.se * math.sqrt(self.n)
        if h.test == "equivalence":
            return seeds_needed(sd, h, self.estimate, self.step_alpha)
        against = (h.test == "superiority" and
                   (self.estimate <= 0 if h.direction == "greater" else self.estimate >= 0))
        if against or self.estimate == 0:
            return None
        return seeds_needed(sd, replace(h, margin=abs(self.estimate)), alpha=self.step_alpha)

    @property
    def complete(self) -> bool:
        """Whether the plan's seeds are all in (a row is tested only then: no peeking)."""
        return self.n >= self.hypothesis.seeds

    def verdict(self, alpha: float) -> str:
        """The verdict at the family-wise level alpha (Holm)."""
        h = self.hypothesis
        if self.n == 0:
            return f"not run (0 of {h.seeds} seeds)"
        if not self.complete:  # seeds >= 2 in every plan, so n < 2 lands here
            return f"incomplete ({self.n} of {h.seeds} seeds): not tested"
        hides = max(abs(self.low), abs(self.high))
        if self.p_holm < alpha:
            return {"difference": "a > b" if self.estimate > 0 else "a < b",
                    "superiority": "supported",
                    "equivalence": f"equivalent within ±{h.margin:g}"}[h.test]
        if h.test == "equivalence":
            reach = math.ceil(self.deciding_margin() * 100) / 100  # up: it is not decided
            return (f"not shown equivalent (at the level Holm asks of it, the test's interval "
                    f"reaches {reach:.2f})")
        if h.test == "superiority":  # only the claimed direction's side of the interval
            hides = self.high if h.direction == "greater" else -self.low
            if hides <= 0:
                side = "below" if h.direction == "greater" else "above"
                return f"undecided (the whole interval lies {side} 0, against the hypothesis)"
        return f"undecided (could hide an effect of up to {hides:.2f})"


def deciding_level(ps: list[float], i: int, alpha: float) -> float:
    """The largest p that row i could have for Holm's procedure over the family to decide it,
    the other rows' p as they are (its rank moves with its p; bisection, to 1e-12)."""
    low, high = 0.0, alpha
    for _ in range(60):
        mid = (low + high) / 2
        if holm([mid if j == i else p for j, p in enumerate(ps)])[i] <= alpha:
            low = mid
        else:
            high = mid
    return low


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
    return Row(h, iv.n, iv.mean, iv.low, iv.high, min(p, 1.0), se=iv.se, seeds=seeds,
               dof=iv.dof, frontier=frontier_gap(h, seeds[0], cache))


def evaluate(plan: Plan, cache: dict | None = None) -> list[Row]:
    """Every hypothesis's row, Holm-adjusted over the whole family, budgets checked (records
    read through `cache`, a fresh one when None)."""
    cache = {} if cache is None else cache
    rows = [contrast(h, cache) for h in plan.hypotheses]
    ps = [r.p if r.complete else 1.0 for r in rows]
    for i, row in enumerate(rows):
        row.step_alpha = deciding_level(ps, i, plan.alpha)
    for row, adjusted in zip(rows, holm(ps)):
        row.p_holm = adjusted
        h = row.hypothesis
        if row.n >= 2:
            arms = [(run_data(arm.folder, cache), arm, seeds) for arm, seeds in
                    zip((h.a, h.b), row.seeds)]
            ba, bb = (arm_budget(d, arm.task, arm.method, seeds=seeds,
                                 iterations=arm.iterations) for d, arm, seeds in arms)
            row.flags = differing(ba, bb, skip=h.factor_budgets)
            row.structure = method_differences(h.a.method, h.b.method)
            for name in ("commit", "draws"):
                made = [made_with(d, arm, name, seeds) for d, arm, seeds in arms]
                if made[0] != made[1] or len(made[0]) > 1:
                    row.flags.append(f"{name} {' + '.join(made[0])} vs {' + '.join(made[1])}")
    return rows


STRUCTURE = {"n_agents": "models", "knowledge_transfer": "knowledge transfer",
             "reward_mode": "reward", "role_exchange": "role exchange",
             "shared_policy": "one policy for every position", "matched_steps": "matched steps"}


def method_differences(a: str, b: str) -> list[str]:
    """How two methods differ: their learner, and each field of their structures."""
    ma, mb = resolve_method(a), resolve_method(b)
    out = [] if ma.learner is mb.learner else [f"learner {ma.learner.name} vs {mb.learner.name}"]
    for name, label in STRUCTURE.items():
        va, vb = getattr(ma.structure, name), getattr(mb.structure, name)
        if va != vb:
            out.append(f"{label} {_said(va)} vs {_said(vb)}")
    return out


def _said(value) -> str:
    """A structure field's value in words."""
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) \
        else str(value)


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


def power_at(sd: float, n: int, h: Hypothesis, alpha: float) -> float:
    """The power of `h`'s test with n paired seeds of per-seed spread `sd`, for a true effect
    of its margin (difference, superiority) or of 0 (equivalence within ±margin): the
    noncentral t's tail beyond the test's critical value."""
    if n < 2 or not sd > 0:
        return math.nan
    df, se = n - 1, sd / math.sqrt(n)
    if h.test == "equivalence":  # both one-sided tests reject, the truth at 0
        q = t_quantile(df, 1 - alpha)
        return max(0.0, 2 * float(_nct.sf(q, df, h.margin / se)) - 1)  # each misses apart
    q = t_quantile(df, 1 - (alpha / 2 if h.test == "difference" else alpha))
    return float(_nct.sf(q, df, h.margin / se))


def power_line(h: Hypothesis, sd: float, alpha: float, strict: float) -> str:
    """Seeds for 80% power and the power at the planned seeds, at alpha and Holm's first step."""
    need = [seeds_needed(sd, h, 0.0, a) or "> 200" for a in (alpha, strict)]
    have = [power_at(sd, h.seeds, h, a) for a in (alpha, strict)]
    return (f"margin {h.margin:g}: 80% power needs {need[0]} seeds at alpha {alpha:g}, "
            f"{need[1]} at {strict:.2g}; the planned {h.seeds} give {have[0]:.0%} and "
            f"{have[1]:.0%}")


def pilot_made(pilot: Hypothesis, cache: dict) -> str:
    """The commits that made a pilot's arms' records ("commit unrecorded" before they were
    kept)."""
    commits = set()
    for arm in (pilot.a, pilot.b):
        data = cache.get(str(Path(arm.folder)))
        if data is not None:
            commits |= set(made_with(data, arm, "commit", {int(r["seed"]) for r in
                                                             alone_records(data, arm)}))
    commits.discard("unrecorded")
    return f"commit {', '.join(sorted(commits))}" if commits else "commit unrecorded"


def pilot_differences(h: Hypothesis, pilot: Hypothesis, cache: dict) -> str:
    """How the pilot's arms spent differently from the plan's own arms, once the plan's have
    records ("" when they match, or have none yet)."""
    said = []
    for label, ours, theirs in (("a", h.a, pilot.a), ("b", h.b, pilot.b)):
        if not trajectories(ours, cache) or not trajectories(theirs, cache):
            continue
        mine = arm_budget(run_data(ours.folder, cache), ours.task, ours.method,
                          iterations=ours.iterations)
        then = arm_budget(run_data(theirs.folder, cache), theirs.task, theirs.method)
        if diff := differing(then, mine):
            said.append(f"its {label} arm ({theirs.method}) spent {'; '.join(diff)} "
                        f"(pilot vs plan)")
    return "; the pilot differs from the plan: " + "; ".join(said) if said else ""


def power_lines(plan: Plan) -> list[str]:
    """Each hypothesis's seeds from the spread of its contrast in its pilot folder, at the
    plan's alpha and at alpha / m (Holm's first step over the m hypotheses)."""
    cache: dict = {}
    out, strict = [], plan.alpha / max(1, len(plan.hypotheses))
    for h in plan.hypotheses:
        if h.pilot is None and h.sd is not None:
            out.append(f"{h.id}: assumed per-seed sd {h.sd:g} (no pilot folder), "
                       + power_line(h, h.sd, plan.alpha, strict))
            continue
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
        have = [power_at(sd, h.seeds, h, a) for a in (plan.alpha, strict)]
        out.append(f"{h.id}: pilot {h.pilot} ({pilot_made(pilot, cache)}) {r.estimate:+.2f}, "
                   f"per-seed sd {sd:.3f} over {r.n} seeds, margin {h.margin:g}: 80% power "
                   f"needs {need[0]} seeds at alpha {plan.alpha:g}, {need[1]} at {strict:.2g} "
                   f"(planned {h.seeds}: power {have[0]:.0%} and {have[1]:.0%})"
                   + pilot_differences(h, pilot, cache))
    return out
