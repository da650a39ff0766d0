"""Why the answer is what it is: the factor study's table, generated from its pre-stated plan.

    python -m benchmarks.why docs/fidelity/plan.toml              # the table, from the records
    python -m benchmarks.why docs/fidelity/plan.toml --out docs/fidelity/why.md
    python -m benchmarks.why docs/fidelity/plan.toml --power      # seeds each hypothesis needs
    python -m benchmarks.why docs/fidelity/plan.toml --check docs/fidelity.md   # its summary

The plan (a TOML file committed before its runs) names each hypothesis: two arms (a folder,
a method, the task, and optionally the iterations read), the quantity compared (`alone_gain`:
the mean alone reward over the points after the base minus the base's, per seed;
`final_gain`: the last point's), pairing (`paired` by seed, or `welch` for arms that share no
seeds or machine), the test and its margin:
- `difference`: two-sided, a − b ≠ 0; verdict "a > b", "a < b" or "undecided";
- `superiority`: one-sided in `direction` ("greater": a − b > 0); "supported" or "undecided";
- `equivalence`: |a − b| < margin by two one-sided tests; "equivalent within ±margin" or
  "not shown equivalent".
Holm's correction runs over the whole family: a hypothesis with fewer seeds than planned
(no records yet, or runs still going) counts with p = 1, so the family never shrinks, and its
row shows the estimate so far but no test: no verdict is read before the plan's seeds are in.
An undecided row says the largest effect its interval still allows (a one-sided row: in
its direction, or that the whole interval lies against it). A contrast whose arms
differ in a budget that is not its factor (`benchmarks.budgets`; `factor_budgets` lists the
ones it varies), or whose records were made by different code or draws (each record's
`commit` and `draws`), is flagged in bold. `--check DOC` holds a document's summary (the
section "What the evidence supports") to the table: every sentence cites its rows ([S1]),
"same" only where a cited row shows equivalence, an undecided row said to be undecided.
Each arm's method and task must be registered or listed in its folder's run_config.json (a
plug-in's), so a misspelt arm is refused by name, not read as "not run" forever.
The same plan and records give the same bytes.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Set
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path

import tomllib

from agents.learners.base import registered_methods, resolve_method
from cory_common import cli
from cory_common.files import atomic_write
from cory_common.threads import configure
from cory_env import registered_tasks

from .budgets import arm_budget, differing
from .intervals import ALPHA, POWER, holm, mean_interval, t_quantile, welch_interval
from .records import RunData

SUMMARY = "What the evidence supports"
SAMENESS = re.compile(r"\b(same|equal|equals|equivalent|unchanged|identical|alike|no different)\b",
                      re.IGNORECASE)
NUMBER = r"\d+(?:\.\d+)?(?:e-?\d+)?"
HOLM_P = re.compile(rf"Holm p ({NUMBER}(?: and {NUMBER})*)")  # "Holm p 0.051", "… 2e-6 and 1"
CITATION = re.compile(r"\[([A-Za-z][\w-]*(?:,\s*[A-Za-z][\w-]*)*)\](?!\()")  # [S1, F2a]
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


def render(plan: Plan, rows: list[Row], source: str) -> str:
    """The markdown table of the family."""
    lines = [f"Generated by `python -m benchmarks.why {source}` from the plan written "
             f"{plan.written} and the records it names; Holm's correction over all "
             f"{len(rows)} hypotheses at α = {plan.alpha:g}.", "",
             "| id | hypothesis | a | b | quantity | a − b [95% CI] | test | p | Holm p | "
             "verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        h = r.hypothesis
        test = {"difference": "two-sided", "superiority": f"one-sided ({h.direction})",
                "equivalence": f"TOST ±{h.margin:g}"}[h.test]
        est = "–" if r.n < 2 else f"{r.estimate:+.2f} [{r.low:+.2f}, {r.high:+.2f}] (n={r.n})"
        verdict = r.verdict(plan.alpha)
        if r.flags:
            verdict += "; **budgets differ: " + ", ".join(r.flags) + "**"
        p = f"{r.p:.3g}" if r.complete else "–"
        ph = f"{r.p_holm:.3g}" if r.complete else "–"
        lines.append(f"| {h.id} | {h.claim} | {h.a.label()} | {h.b.label()} | "
                     f"{h.quantity.replace('_', ' ')} ({h.pairing}) | {est} | {test} | {p} | "
                     f"{ph} | {verdict} |")
    return "\n".join(lines) + "\n"


def _section(text: str, title: str) -> list[tuple[int, str]]:
    """(first line number, text) of each paragraph or list item under the heading `title`,
    up to the next heading of its level or above."""
    lines, level, items = text.splitlines(), None, []
    for n, line in enumerate(lines, 1):
        heading = re.match(r"(#+)\s+(.*)", line)
        if heading and level is None and heading[2].strip() == title:
            level = len(heading[1])
            continue
        if level is None:
            continue
        if heading and len(heading[1]) <= level:
            break
        starts = re.match(r"\s*([-*]|\d+\.)\s+", line) and not line.startswith("  ")
        if not line.strip() or heading:
            items.append(None)
        elif starts or not items or items[-1] is None:
            items.append((n, line.strip()))
        else:
            items[-1] = (items[-1][0], items[-1][1] + " " + line.strip())
    return [i for i in items if i] if level is not None else []


def check_summary(text: str, rows: list[Row], alpha: float, title: str = SUMMARY) -> list[str]:
    """What breaks the rules of a summary in `text` (under the heading `title`): every sentence
    cites rows of the table ([S1], [F2a, F2b]); a cited row has all its seeds; "same" and its
    kin only where a cited row shows equivalence; an undecided or not-shown row is said so; a
    quoted Holm p is a cited row's in the table, to the digits quoted."""
    by_id = {r.hypothesis.id: r for r in rows}
    items = _section(text, title)
    if not items:
        return [f"no section headed {title!r}"]
    problems = []
    for line, item in items:
        body = re.sub(r"^([-*]|\d+\.)\s+", "", item)
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z\[(`*_])", body):
            where = f"line {line}: {sentence[:60]!r}"
            ids = [i.strip() for m in CITATION.findall(sentence) for i in m.split(",")]
            if not ids:
                problems.append(f"{where} cites no row of the table")
                continue
            unknown = [i for i in ids if i not in by_id]
            if unknown:
                problems.append(f"{where} cites {', '.join(unknown)}, not in the plan")
                continue
            verdicts = {i: by_id[i].verdict(alpha) for i in ids}
            for i, v in verdicts.items():
                if not by_id[i].complete:
                    problems.append(f"{where} cites {i}, which is {v}")
                elif v.startswith("undecided") and "undecided" not in sentence:
                    problems.append(f"{where} cites {i} without saying it is undecided")
                elif v.startswith("not shown") and "not shown" not in sentence:
                    problems.append(f"{where} cites {i} without saying equivalence is not "
                                    f"shown")
            values = [v for q in HOLM_P.findall(sentence) for v in q.split(" and ")]
            tables = [by_id[i].p_holm for i in ids]
            for value in values:  # a cited row's adjusted p, to the last digit quoted
                unit = 10.0 ** Decimal(value).as_tuple().exponent
                if all(abs(float(value) - t) > 0.51 * unit for t in tables):
                    said = ", ".join(f"{i}'s {t:.3g}" for i, t in zip(ids, tables))
                    problems.append(f"{where} quotes Holm p {value}; the table has {said}")
            same = SAMENESS.search(sentence)
            if same and not any(v.startswith("equivalent") for v in verdicts.values()):
                problems.append(f"{where} says {same[0]!r} but no row it cites shows "
                                f"equivalence")
    return problems


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


def main(argv: list[str] | None = None) -> None:
    """Render the table of a plan (or its power lines)."""
    p = cli.Parser("python -m benchmarks.why", description=__doc__)
    p.add_argument("plan", help="the plan file (TOML)")
    p.add_argument("--out", help="write the table here (markdown) instead of printing it")
    p.add_argument("--power", action="store_true", help="seeds each hypothesis needs")
    p.add_argument("--check", metavar="DOC", help="check the summary of this markdown file "
                   f"(the section {SUMMARY!r}) against the table: every sentence cites its rows")
    args = p.parse_args(argv)
    configure()
    try:
        plan = Plan.load(args.plan)
    except (OSError, ValueError) as err:
        p.error(str(err))
    if args.power:
        print("\n".join(power_lines(plan)))
        return
    rows = evaluate(plan)
    if args.check:
        try:
            problems = check_summary(Path(args.check).read_text(), rows, plan.alpha)
        except OSError as err:
            p.error(str(err))
        print("\n".join(problems) or f"{args.check}: every sentence of the summary cites "
              f"its rows")
        sys.exit(1 if problems else 0)
    text = render(plan, rows, args.plan)
    if args.out:
        atomic_write(args.out, text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
