"""The paper's claims, each decided by one pre-stated test on the models answering alone.

Every claim reads the alone-evaluation points (`alone.jsonl`: every model of every method
answering held-out queries alone every `eval_every` iterations), one trajectory per seed: a
multi-model method's trajectory is the mean of its models at each point ("a CORY-trained
model, either one"); trends and final points read it smoothed over points, frontiers read the
raw points (`benchmarks.stats`). Per seed, paired by seed:

(1) similar final reward, PPO's KL more than twice CORY's: the final rewards are equivalent
    within ±δ (two one-sided tests) *and* log(KL_PPO / KL_CORY) at the final point > log 2.
(1a) at matched reward, log(KL_PPO / KL_CORY) > log 2 (the frontier reading of (1)).
(1b) at matched KL, reward_CORY − reward_PPO > 0 (the frontier reading of (1)).
(2) exact-match tasks, PPO peaks then declines while CORY does not: over the second half of
    the points, CORY's change of reward minus PPO's > δ.
(3) both ablations need more KL than CORY: the mean over cory-no-kt and cory-no-re of
    log(KL_ablation / KL_CORY) at matched reward > 0.
(4) CORY's combined reward r − η·ΣKL rises while PPO's falls: over the second half, CORY's
    change minus PPO's > 0.

δ is MEANINGFUL (10%) of the task's reward scale. Each test gives a one-sided p-value for the
claim and one against it (t-tests over seeds; an "and" takes the larger p, an "or" the
Bonferroni-corrected smaller); the claim's p is twice the smaller of the two, so that before
correction a verdict is the 95% interval lying on one side. Within each task, Holm's method
adjusts the p-values of the claims that could be tested; a claim is *supported* or
*contradicted* on this model only when its adjusted p < 0.05, and *inconclusive* otherwise,
or with fewer than 3 seeds, fewer than 5 evaluation points, no shared range to match, or a
method whose best smoothed alone reward is not above the base model's (the raw first point),
with the reason. Each claim states the effect it could detect at these seeds, and the report
puts the model's measured mechanism beside every verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from agents.training.stats import ALPHA, detectable_effect, holm

from .records import RunData, Trajectory
from .stats import Interval, change, common_range, kl_at_reward, mean_interval, reward_at_kl

SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"
ABLATIONS = ("cory-no-kt", "cory-no-re")
MIN_SEEDS, MIN_POINTS = 3, 5
LEVELS = (0.25, 0.5, 0.75, 1.0)  # matched points: these fractions of the shared range
MEANINGFUL = 0.10  # a reward change or gap within ±10% of the task's reward scale is negligible
KL_RATIO = 2.0  # claim (1)'s "more than twice"
KL_FLOOR = 1e-6  # log KL of a point at KL 0


@dataclass
class Claim:
    """One of the paper's claims, checked against this run's numbers.

    `p_for` and `p_against` are the one-sided p-values of the claim and of its negation; `p`
    is the Holm-adjusted p of the verdict (NaN when the claim could not be tested).
    """

    name: str
    status: str
    numbers: str
    reason: str = ""
    intervals: dict[str, Interval] = field(default_factory=dict)
    p_for: float = math.nan
    p_against: float = math.nan
    p: float = math.nan
    sizes: dict[str, Interval] = field(default_factory=dict)  # whose detectable effect to state
    threshold: str = "0"  # what the interval is tested against, as text
    against: str = ""  # what a contradiction means here
    detectable: str = ""
    scope: str = ""

    @property
    def tested(self) -> bool:
        """Whether a test was run (the inputs allowed one)."""
        return math.isfinite(self.p_for) and math.isfinite(self.p_against)

    @property
    def p_raw(self) -> float:
        """The unadjusted p of the more likely direction (twice the smaller one-sided p)."""
        return min(1.0, 2 * min(self.p_for, self.p_against)) if self.tested else math.nan

    def line(self) -> str:
        """The report line: name, verdict with its scope and reason, then the numbers."""
        where = " on this model" if self.status != INCONCLUSIVE else ""
        why = "; ".join(x for x in (self.reason, self.scope) if x)
        why = f" ({why})" if why else ""
        p = f" Holm-adjusted p = {self.p:.3g} (raw {self.p_raw:.3g})." if self.tested else ""
        mde = f" Detectable at these seeds: {self.detectable}." if self.detectable else ""
        return f"- **{self.name}**: **{self.status}**{where}{why}.{p} {self.numbers}{mde}".rstrip()


def untested(name: str, reason: str, numbers: str = "", **ivs: Interval) -> Claim:
    """A claim that could not be tested, with the reason."""
    return Claim(name, INCONCLUSIVE, numbers, reason, dict(ivs))


# ------------------------------------------------------------------------------- inputs
@dataclass
class Inputs:
    """The smoothed trajectories of the compared methods on the seeds they share."""

    trajectories: dict[str, dict[int, Trajectory]]
    seeds: list[int]
    scale: float  # the task's reward scale (MEANINGFUL of it is negligible)
    problem: str = ""  # why no verdict can be given, if so
    gains: dict[str, Interval] = field(default_factory=dict)
    raw: dict[str, dict[int, Trajectory]] = field(default_factory=dict)

    def per_seed(self, method: str) -> list[Trajectory]:
        """The method's smoothed trajectories in seed order (trends, final points)."""
        return [self.trajectories[method][s] for s in self.seeds]

    def points(self, method: str) -> list[Trajectory]:
        """The method's raw points in seed order (frontiers: smoothing neighbours along a
        convex frontier moves them off it, the more so for a method that moves faster)."""
        return [self.raw[method][s] for s in self.seeds]

    @property
    def delta(self) -> float:
        """The negligible band's half-width δ."""
        return MEANINGFUL * self.scale


def gather(data: RunData, task: str, eta, methods: list[str]) -> Inputs:
    """The claim inputs, with `problem` set when a verdict cannot be given."""
    raw = {m: data.trajectories(task, m, eta) for m in methods}  # finished seeds only
    seeds = sorted(set.intersection(*(set(t) for t in raw.values()))) if raw else []
    trajs = {m: {s: t[s].smoothed() for s in seeds} for m, t in raw.items()}
    out = Inputs(trajs, seeds, data.alone_reward_scale(task),
                 raw={m: {s: t[s] for s in seeds} for m, t in raw.items()})
    problems = []
    if len(seeds) < MIN_SEEDS:
        problems.append(f"too few seeds: {len(seeds)} < {MIN_SEEDS}")
    points = min((len(raw[m][s].iterations) for m in raw for s in seeds), default=0)
    if points < MIN_POINTS:
        problems.append(f"too few evaluation points: {points} < {MIN_POINTS}")
    for m in methods:  # best smoothed alone reward minus the base model's own (raw) point
        gain = mean_interval([trajs[m][s].reward.max() - raw[m][s].reward[0] for s in seeds])
        out.gains[m] = gain
        if len(seeds) >= 2 and not gain.above(0):
            problems.append(f"{m} did not learn: its best smoothed alone reward minus the base "
                            f"model's is {gain}")
    out.problem = "; ".join(problems)
    return out


def _missing(data: RunData, task: str, eta, methods) -> list[str]:
    """Methods without alone-evaluation records on this task."""
    return [m for m in methods if not data.trajectories(task, m, eta)]


def _log(x: float) -> float:
    """log of a KL, floored at KL_FLOOR (NaN stays NaN)."""
    return math.log(max(x, KL_FLOOR)) if math.isfinite(x) else math.nan


# ------------------------------------------------------------------------------- frontier
def reward_levels(curves: list[Trajectory]) -> list[float]:
    """LEVELS of the best-reward range every curve observed (none when they share none)."""
    lo, hi = common_range([(t.kl, t.reward) for t in curves], "reward")
    return [min(lo + f * (hi - lo), hi) for f in LEVELS] if hi > lo else []


def kl_levels(curves: list[Trajectory]) -> list[float]:
    """LEVELS of the KL range every curve observed (none when they share none)."""
    lo, hi = common_range([(t.kl, t.reward) for t in curves], "kl")
    return [min(lo + f * (hi - lo), hi) for f in LEVELS] if hi > lo else []


def log_kl_ratios(a: list[Trajectory], b: list[Trajectory], levels: list[float]) -> list[float]:
    """Per seed, the mean over reward levels of log(KL_a / KL_b) at that reward."""
    return [float(np.mean([_log(kl_at_reward(x.kl, x.reward, r))
                           - _log(kl_at_reward(y.kl, y.reward, r)) for r in levels]))
            if levels else math.nan for x, y in zip(a, b)]


def matched_kl_ratio(a: list[Trajectory], b: list[Trajectory]) -> tuple[Interval, list[float]]:
    """log(KL_a / KL_b) at matched rewards (LEVELS of the best-reward range every seed of both
    observed), per seed; (interval of the mean, the levels)."""
    levels = reward_levels(a + b)
    return mean_interval(log_kl_ratios(a, b, levels)), levels


def matched_reward_gap(a: list[Trajectory], b: list[Trajectory]) -> tuple[Interval, list[float]]:
    """reward_a − reward_b at matched KL budgets (LEVELS of the KL range every seed of both
    observed), per seed; (interval of the mean, the budgets)."""
    budgets = kl_levels(a + b)
    per_seed = [float(np.mean([reward_at_kl(x.kl, x.reward, k) - reward_at_kl(y.kl, y.reward, k)
                               for k in budgets])) if budgets else math.nan
                for x, y in zip(a, b)]
    return mean_interval(per_seed), budgets


def _kl_side(iv: Interval) -> str:
    """Which side of 1× a log-KL ratio below 2× lies."""
    return ("CORY needs more KL than PPO" if iv.below(0) else
            "CORY needs less KL, but not half" if iv.above(0) else
            "the ratio is below 2× and its interval contains 1×")


def ratio_text(iv: Interval) -> str:
    """A log-ratio interval as a ratio with its interval."""
    if iv.n == 0 or not math.isfinite(iv.mean):
        return "n/a"
    e = lambda x: f"{math.exp(x):.3g}" if math.isfinite(x) else ("inf" if x > 0 else "0")  # noqa: E731
    if iv.n == 1:
        return f"{e(iv.mean)}× (1 seed: no interval)"
    return f"{e(iv.mean)}× [95% CI {e(iv.low)}, {e(iv.high)}; n={iv.n} seeds]"


def _levels(xs: list[float]) -> str:
    """Matched points as text."""
    return ", ".join(f"{x:.3g}" for x in xs) or "(none shared)"


# ------------------------------------------------------------------------------- tests
def tested(name: str, numbers: str, inp: Inputs, p_for: float, p_against: float,
           ivs: dict[str, Interval], sizes: dict[str, Interval], threshold: str = "0",
           against: str = "") -> Claim:
    """A claim with its two p-values, or untested when the inputs forbid a verdict. `sizes`:
    the intervals whose detectable effects the report states; `against`: what a
    contradiction means."""
    n = min((iv.n for iv in ivs.values()), default=0)
    if inp.problem:
        return untested(name, inp.problem, numbers, **ivs)
    if n < MIN_SEEDS:
        return untested(name, f"only {n} seeds have a value on the shared range "
                              f"(< {MIN_SEEDS})", numbers, **ivs)
    return Claim(name, INCONCLUSIVE, numbers, "", ivs, p_for, p_against, sizes=sizes,
                 threshold=threshold, against=against)


def matched(name: str, numbers: str, inp: Inputs, iv: Interval, levels: list[float], axis: str,
            threshold: float, shown: str, against: str) -> Claim:
    """A frontier claim: `iv` against `threshold` on levels of `axis` ("reward" or "KL") that
    every seed observed, or untested when they share no range."""
    if not levels and not inp.problem:
        what = "frontiers" if axis == "reward" else "KL ranges"
        return untested(name, f"no common {axis} range: the seeds' {what} do not overlap",
                        numbers, value=iv)
    size = "log KL ratio" if axis == "reward" else "reward gap"
    return tested(name, numbers, inp, iv.p_above(threshold), iv.p_below(threshold),
                  {"value": iv}, {size: iv}, shown, against)


def _pair(data: RunData, task: str, eta, name: str) -> Inputs | Claim:
    """PPO's and CORY's inputs, or the inconclusive claim when either was not run."""
    if _missing(data, task, eta, ["ppo", "cory"]):
        return untested(name, "not run: needs alone-evaluations of ppo and cory on this task")
    return gather(data, task, eta, ["ppo", "cory"])


def final_point(t: Trajectory, field_: str) -> float:
    """A smoothed trajectory's last point of one field."""
    return float(getattr(t, field_)[-1])


def claim_efficiency(data: RunData, task: str, eta) -> Claim:
    """(1): equivalent final reward and log(KL_PPO / KL_CORY) > log 2 at it."""
    name = f"(1) similar final reward, and PPO's KL more than twice CORY's at it [{task}]"
    inp = _pair(data, task, eta, name)
    if isinstance(inp, Claim):
        return inp
    ppo, cory = inp.per_seed("ppo"), inp.per_seed("cory")
    gap = mean_interval([final_point(c, "reward") - final_point(p, "reward")
                         for p, c in zip(ppo, cory)])
    ratio = mean_interval([_log(final_point(p, "kl")) - _log(final_point(c, "kl"))
                           for p, c in zip(ppo, cory)])
    d, lk = inp.delta, math.log(KL_RATIO)
    p_equal = max(gap.p_above(-d), gap.p_below(d))  # two one-sided tests
    p_for = max(p_equal, ratio.p_above(lk))  # both parts must hold
    apart, below = min(gap.p_below(-d), gap.p_above(d)), ratio.p_below(lk)
    p_against = min(1.0, 3 * min(apart, below))
    numbers = (f"Final reward CORY − PPO {gap} (equivalent within ±{d:.3g}, 10% of the reward "
               f"scale {inp.scale:.3g}); KL_PPO / KL_CORY at the final point {ratio_text(ratio)}"
               f" (threshold {KL_RATIO:g}×). Best gains over the base: PPO {inp.gains['ppo']}, "
               f"CORY {inp.gains['cory']}.")
    against = ("the final rewards differ by more than ±δ" if apart < below else  # the evidence
               f"the KL ratio is below {KL_RATIO:g}×")
    return tested(name, numbers, inp, p_for, p_against, {"reward_gap": gap, "log_kl_ratio": ratio},
                  {"reward gap": gap, "log KL ratio": ratio},
                  f"±{d:.3g} and {KL_RATIO:g}×", against)


def claim_kl_at_reward(data: RunData, task: str, eta) -> Claim:
    """(1a): at matched reward, PPO's KL > 2x CORY's."""
    name = f"(1a) at matched reward, PPO's KL is more than twice CORY's [{task}]"
    inp = _pair(data, task, eta, name)
    if isinstance(inp, Claim):
        return inp
    iv, levels = matched_kl_ratio(inp.points("ppo"), inp.points("cory"))
    numbers = (f"KL_PPO / KL_CORY at rewards {_levels(levels)} (25-100% of the best-reward range"
               f" every seed observed): {ratio_text(iv)}; threshold {KL_RATIO:g}×.")
    return matched(name, numbers, inp, iv, levels, "reward", math.log(KL_RATIO),
                   f"{KL_RATIO:g}×", _kl_side(iv))


def claim_reward_at_kl(data: RunData, task: str, eta) -> Claim:
    """(1b): at matched KL, CORY's reward > PPO's."""
    name = f"(1b) at matched KL, CORY's reward is higher than PPO's [{task}]"
    inp = _pair(data, task, eta, name)
    if isinstance(inp, Claim):
        return inp
    iv, budgets = matched_reward_gap(inp.points("cory"), inp.points("ppo"))
    numbers = (f"reward_CORY − reward_PPO at KL {_levels(budgets)} nats (25-100% of the KL range"
               f" every seed observed): {iv}.")
    return matched(name, numbers, inp, iv, budgets, "KL", 0.0, "0",
                   "CORY's reward is lower at matched KL")


def late_change(traj: Trajectory, field_: str = "reward") -> float:
    """A trajectory's change over its second half of evaluation points (at least 3 points)."""
    n = len(traj.iterations)
    start = min(n // 2, max(n - 3, 0))
    return change(traj.iterations[start:], getattr(traj, field_)[start:])


def band(iv: Interval, delta: float) -> str:
    """Where a change lies against the symmetric ±δ band: rises, falls, negligible or
    undecided."""
    if iv.above(delta):
        return "rises"
    if iv.below(-delta):
        return "falls"
    if iv.within(-delta, delta):
        return "negligible"
    return "undecided"


def _changes(inp: Inputs, field_: str) -> tuple[dict[str, Interval], Interval, str]:
    """Each method's second-half change, the paired contrast CORY − PPO, and as text."""
    each = {m: mean_interval([late_change(t, field_) for t in inp.per_seed(m)])
            for m in ("ppo", "cory")}
    contrast = mean_interval([late_change(c, field_) - late_change(p, field_)
                              for p, c in zip(inp.per_seed("ppo"), inp.per_seed("cory"))])
    text = "; ".join(f"{m.upper()} {iv} ({band(iv, inp.delta)})" for m, iv in each.items())
    return each, contrast, text


def claim_peak_decline(data: RunData, task: str, eta) -> Claim:
    """(2): over the second half, CORY's change of reward minus PPO's > δ."""
    name = f"(2) PPO's reward peaks then declines, CORY's does not [{task}]"
    inp = _pair(data, task, eta, name)
    if isinstance(inp, Claim):
        return inp
    each, contrast, text = _changes(inp, "reward")
    numbers = (f"Change of the smoothed alone reward over the second half, CORY − PPO: "
               f"{contrast} (threshold δ = {inp.delta:.3g}, 10% of the reward scale "
               f"{inp.scale:.3g}); each, against the band ±δ: {text}.")
    against = "PPO's reward does not decline more than CORY's" + (
        "; CORY's declines too" if band(each["cory"], inp.delta) == "falls" else "")
    return tested(name, numbers, inp, contrast.p_above(inp.delta), contrast.p_below(inp.delta),
                  {"contrast": contrast, **each}, {"contrast": contrast}, f"δ = {inp.delta:.3g}",
                  against)


def claim_combined(data: RunData, task: str, eta) -> Claim:
    """(4): over the second half, CORY's change of combined reward minus PPO's > 0."""
    name = f"(4) CORY's combined reward r − η·ΣKL rises while PPO's falls [{task}]"
    inp = _pair(data, task, eta, name)
    if isinstance(inp, Claim):
        return inp
    each, contrast, text = _changes(inp, "combined")
    numbers = (f"Change of the smoothed alone combined reward (η = {data.alone_eta(task):g}) "
               f"over the second half, CORY − PPO: {contrast} (threshold 0); each, against the "
               f"band ±{inp.delta:.3g}: {text}.")
    against = "CORY's combined reward changes less than PPO's" + (
        "; CORY's combined reward falls" if band(each["cory"], inp.delta) == "falls" else "")
    return tested(name, numbers, inp, contrast.p_above(0), contrast.p_below(0),
                  {"contrast": contrast, **each}, {"contrast": contrast}, "0", against)


def claim_ablations(data: RunData, task: str, eta) -> Claim:
    """(3): the ablations' mean log(KL_ablation / KL_CORY) at matched reward > 0."""
    name = f"(3) no-knowledge-transfer and no-role-exchange need more KL than CORY [{task}]"
    missing = _missing(data, task, eta, ["cory", *ABLATIONS])
    if missing:
        return untested(name, f"not run: needs alone-evaluations of cory and "
                              f"{' and '.join(ABLATIONS)} on this task ({', '.join(missing)} "
                              f"missing)")
    inp = gather(data, task, eta, ["cory", *ABLATIONS])
    cory = inp.points("cory")
    levels = reward_levels(cory + [t for m in ABLATIONS for t in inp.points(m)])
    each = {m: log_kl_ratios(inp.points(m), cory, levels) for m in ABLATIONS}
    both = mean_interval([float(np.mean(x)) for x in zip(*each.values())])
    parts = "; ".join(f"{m} {ratio_text(mean_interval(v))}" for m, v in each.items())
    numbers = (f"KL_ablation / KL_CORY at rewards {_levels(levels)}, the geometric mean of both:"
               f" {ratio_text(both)} (threshold 1×); each (exploratory): {parts}.")
    return matched(name, numbers, inp, both, levels, "reward", 0.0, "1×",
                   "the ablations need less KL than CORY")


# ------------------------------------------------------------------------------- verdicts
def decide(group: list[Claim], alpha: float = ALPHA) -> list[Claim]:
    """Holm over the group's tested claims: each gets its adjusted p, verdict, reason and the
    effects it could detect at Holm's strictest level."""
    live = [c for c in group if c.tested]
    for c, p in zip(live, holm([c.p_raw for c in live])):
        c.p = p
        if p < alpha:
            c.status = SUPPORTED if c.p_for <= c.p_against else CONTRADICTED
            c.reason = c.against if c.status == CONTRADICTED else ""
        else:
            c.reason = (f"Holm-adjusted p = {p:.3g} ≥ {alpha:g} over the task's {len(live)} "
                        f"tested claims" if c.p_raw < alpha else
                        f"the interval contains {c.threshold}")
        level = alpha / len(live)
        c.detectable = ", ".join(
            f"{what} ±{detectable_effect(iv.se * math.sqrt(iv.n), iv.n, level):.3g}"
            for what, iv in c.sizes.items()) + (
            f" (80% power, two-sided at {level:.3g}: Holm's strictest level)")
    return group


def mechanism_scope(data: RunData, task: str) -> str:
    """The model's measured mechanism, as the scope of a verdict."""
    m = data.mechanism.get(task)
    if not m or "not_measured" in m:
        return "mechanism not measured on this model"
    from agents.refmodels.transfer import summarize

    s = summarize(m)
    return f"mechanism: {s['verdict']}, cross-role transfer {s['ratio_text']}"


def all_claims(data: RunData) -> list[Claim]:
    """Every claim check, per task (and per KL setting in a sweep), Holm-adjusted per group."""
    out = []
    for task in data.tasks():
        exact = data.exact_match(task)
        for eta in data.etas(task):
            group = [claim_efficiency(data, task, eta), claim_kl_at_reward(data, task, eta),
                     claim_reward_at_kl(data, task, eta)]
            if exact:
                group.append(claim_peak_decline(data, task, eta))
            group += [claim_ablations(data, task, eta), claim_combined(data, task, eta)]
            scope = mechanism_scope(data, task)
            for c in decide(group):
                c.scope = scope
                if eta is not None:
                    c.name += f" (η={eta:g})"
            out += group
    if not any(data.exact_match(t) for t in data.tasks()):
        out.append(untested("(2) PPO's reward peaks then declines, CORY's does not",
                            "not run: needs an exact-match task (reasoning, arithmetic, "
                            "gsm8k, ...)"))
    return out
