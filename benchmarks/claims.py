"""The paper's claims, each checked on the models answering alone, with an honest verdict.

Every claim reads the alone-evaluation points (`alone.jsonl`: every model of every method
answering held-out queries alone every `eval_every` iterations), one trajectory per seed: a
multi-model method's trajectory is the mean of its models at each point ("a CORY-trained
model, either one"). The statistics are in `benchmarks.stats`.

(1a) at matched reward, PPO needs more than twice CORY's KL; (1b) at matched KL, CORY's reward
is at least PPO's; (2) math tasks: PPO's reward declines over the second half of training while
CORY's does not; (3) the no-knowledge-transfer and no-role-exchange ablations need more KL than
CORY at matched reward; (4) CORY's combined reward r − η·ΣKL rises over the run while PPO's
falls.

A verdict is *supported* or *contradicted* only when the 95% interval over seeds (paired by
seed) lies on one side of the claim's threshold; otherwise, or with fewer than 3 seeds, fewer
than 5 evaluation points, or a method whose best (smoothed) alone reward is not above the base
model's, it is
*inconclusive*, with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cory_env import is_exact_match

from .records import RunData, Trajectory
from .stats import Interval, change, kl_at_reward, mean_interval, reward_at_kl

SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"
ABLATIONS = ("cory-no-kt", "cory-no-re")
MIN_SEEDS, MIN_POINTS = 3, 5
LEVELS = (0.25, 0.5, 0.75, 1.0)  # matched points: these fractions of the shared range
MEANINGFUL = 0.10  # a reward change below 10% of the task's reward scale is negligible
KL_RATIO = 2.0  # claim (1a)'s "more than twice"


@dataclass
class Claim:
    """One of the paper's claims, checked against this run's numbers."""

    name: str
    status: str
    numbers: str
    reason: str = ""
    intervals: dict[str, Interval] = field(default_factory=dict)

    def line(self) -> str:
        """The report line: name, verdict (with its reason) and the numbers used."""
        why = f" ({self.reason})" if self.reason else ""
        return f"- **{self.name}**: **{self.status}**{why}. {self.numbers}".rstrip()


def verdict(interval: Interval, threshold: float) -> str:
    """supported above the threshold, contradicted below it, else inconclusive."""
    if interval.above(threshold):
        return SUPPORTED
    if interval.below(threshold):
        return CONTRADICTED
    return INCONCLUSIVE


# ------------------------------------------------------------------------------- inputs
@dataclass
class Inputs:
    """The smoothed trajectories of the compared methods on the seeds they share."""

    trajectories: dict[str, dict[int, Trajectory]]
    seeds: list[int]
    scale: float  # the task's reward scale (MEANINGFUL of it is negligible)
    problem: str = ""  # why no verdict can be given, if so
    gains: dict[str, Interval] = field(default_factory=dict)

    def per_seed(self, method: str) -> list[Trajectory]:
        """The method's trajectories in seed order."""
        return [self.trajectories[method][s] for s in self.seeds]


def gather(data: RunData, task: str, eta, methods: list[str]) -> Inputs:
    """The claim inputs, with `problem` set when a verdict cannot be given."""
    raw = {m: data.trajectories(task, m, eta) for m in methods}
    seeds = sorted(set.intersection(*(set(t) for t in raw.values()))) if raw else []
    trajs = {m: {s: t[s].smoothed() for s in seeds} for m, t in raw.items()}
    out = Inputs(trajs, seeds, data.alone_reward_scale(task))
    problems = []
    if len(seeds) < MIN_SEEDS:
        problems.append(f"too few seeds: {len(seeds)} < {MIN_SEEDS}")
    points = min((len(t.iterations) for m in raw for t in raw[m].values()), default=0)
    if points < MIN_POINTS:
        problems.append(f"too few evaluation points: {points} < {MIN_POINTS}")
    for m in methods:
        gain = mean_interval([t.reward.max() - t.reward[0] for t in out.per_seed(m)])
        out.gains[m] = gain
        if len(seeds) >= 2 and not gain.above(0):
            problems.append(f"{m} did not learn: its best smoothed alone reward minus the base "
                            f"model's is {gain}")
    out.problem = "; ".join(problems)
    return out


def _missing(data: RunData, task: str, eta, methods) -> list[str]:
    """Methods without alone-evaluation records on this task."""
    return [m for m in methods if not data.trajectories(task, m, eta)]


# ------------------------------------------------------------------------------- frontier
def matched_kl_ratio(a: list[Trajectory], b: list[Trajectory]) -> tuple[Interval, list[float]]:
    """log(KL_a / KL_b) at matched rewards, per seed averaged over LEVELS of the reward range
    both reached in every seed above the base; (interval of the mean, the levels)."""
    base = float(np.mean([t.reward[0] for t in a + b]))
    top = min(float(t.reward.max()) for t in a + b)
    if not top > base:
        return mean_interval([]), []
    levels = [base + f * (top - base) for f in LEVELS]
    floor = 1e-6
    per_seed = [float(np.mean([math.log(max(kl_at_reward(x.kl, x.reward, r), floor))
                               - math.log(max(kl_at_reward(y.kl, y.reward, r), floor))
                               for r in levels])) for x, y in zip(a, b)]
    return mean_interval(per_seed), levels


def matched_reward_gap(a: list[Trajectory], b: list[Trajectory]) -> tuple[Interval, list[float]]:
    """reward_a − reward_b at matched KL budgets (LEVELS of the KL both reached), per seed."""
    top = min(float(t.kl.max()) for t in a + b)
    if not top > 0:
        return mean_interval([]), []
    budgets = [f * top for f in LEVELS]
    per_seed = [float(np.mean([reward_at_kl(x.kl, x.reward, k) - reward_at_kl(y.kl, y.reward, k)
                               for k in budgets])) for x, y in zip(a, b)]
    return mean_interval(per_seed), budgets


def ratio_text(iv: Interval) -> str:
    """A log-ratio interval as a ratio with its interval."""
    if iv.n == 0 or not math.isfinite(iv.mean):
        return "n/a"
    e = lambda x: f"{math.exp(x):.3g}" if math.isfinite(x) else ("inf" if x > 0 else "0")  # noqa: E731
    return f"{e(iv.mean)}× [95% CI {e(iv.low)}, {e(iv.high)}; n={iv.n} seeds]"


def _levels(xs: list[float]) -> str:
    """Matched points as text."""
    return ", ".join(f"{x:.3g}" for x in xs) or "(none shared)"


def _pair(data: RunData, task: str, eta, name: str) -> Inputs | Claim:
    """PPO's and CORY's inputs, or the inconclusive claim when either was not run."""
    if _missing(data, task, eta, ["ppo", "cory"]):
        return Claim(name, INCONCLUSIVE, "", "not run: needs alone-evaluations of ppo and cory "
                     "on this task")
    return gather(data, task, eta, ["ppo", "cory"])


def _against(name: str, numbers: str, inp: Inputs, iv: Interval, points: list,
             threshold: float, shown: str) -> Claim:
    """The verdict of an interval against a threshold, unless the inputs forbid one."""
    if inp.problem or not points:
        return Claim(name, INCONCLUSIVE, numbers, inp.problem or "no shared range to match",
                     {"value": iv})
    status = verdict(iv, threshold)
    reason = f"the interval contains {shown}" if status == INCONCLUSIVE else ""
    return Claim(name, status, numbers, reason, {"value": iv})


def claim_kl_at_reward(data: RunData, task: str, eta) -> Claim:
    """(1a): at matched reward, PPO's KL > 2x CORY's."""
    name = f"(1a) at matched reward, PPO's KL is more than twice CORY's [{task}]"
    inp = _pair(data, task, eta, name)
    if isinstance(inp, Claim):
        return inp
    iv, levels = matched_kl_ratio(inp.per_seed("ppo"), inp.per_seed("cory"))
    numbers = (f"KL_PPO / KL_CORY at rewards {_levels(levels)} (25-100% of the range both "
               f"reached above the base): {ratio_text(iv)}; threshold {KL_RATIO}×. Best gains "
               f"over the base: PPO {inp.gains['ppo']}, CORY {inp.gains['cory']}.")
    claim = _against(name, numbers, inp, iv, levels, math.log(KL_RATIO), f"{KL_RATIO}×")
    if claim.status == CONTRADICTED:  # say which side of 1x the ratio lies
        claim.reason = ("CORY needs more KL than PPO" if iv.below(0) else
                        "CORY needs less KL, but not half" if iv.above(0) else
                        "the ratio is below 2× and its interval contains 1×")
    return claim


def claim_reward_at_kl(data: RunData, task: str, eta) -> Claim:
    """(1b): at matched KL, CORY's reward >= PPO's."""
    name = f"(1b) at matched KL, CORY's reward is higher than PPO's [{task}]"
    inp = _pair(data, task, eta, name)
    if isinstance(inp, Claim):
        return inp
    iv, budgets = matched_reward_gap(inp.per_seed("cory"), inp.per_seed("ppo"))
    numbers = (f"reward_CORY − reward_PPO at KL {_levels(budgets)} nats (25-100% of the KL "
               f"both reached): {iv}.")
    return _against(name, numbers, inp, iv, budgets, 0.0, "0")


# ------------------------------------------------------------------------------- trends
def late_change(traj: Trajectory, field_: str = "reward") -> float:
    """A trajectory's change over its second half of evaluation points (at least 3 points)."""
    n = len(traj.iterations)
    start = min(n // 2, max(n - 3, 0))
    return change(traj.iterations[start:], getattr(traj, field_)[start:])


def claim_peak_decline(data: RunData, task: str, eta) -> Claim:
    """(2): PPO's reward declines over the second half, CORY's does not."""
    name = f"(2) PPO's reward peaks then declines, CORY's does not [{task}]"
    inp = _pair(data, task, eta, name)
    if isinstance(inp, Claim):
        return inp
    ppo = mean_interval([late_change(t) for t in inp.per_seed("ppo")])
    cory = mean_interval([late_change(t) for t in inp.per_seed("cory")])
    peak = mean_interval([float(t.reward.max() - t.reward[-1]) for t in inp.per_seed("ppo")])
    delta = MEANINGFUL * inp.scale
    numbers = (f"change of the smoothed alone reward over the second half of the evaluation "
               f"points: PPO {ppo}, CORY {cory}; PPO's peak minus its final {peak}; a change "
               f"within ±{delta:.3g} (10% of the reward scale {inp.scale:.3g}) is negligible.")
    ivs = {"ppo": ppo, "cory": cory}
    if inp.problem:
        return Claim(name, INCONCLUSIVE, numbers, inp.problem, ivs)
    if ppo.below(0) and cory.above(-delta):
        return Claim(name, SUPPORTED, numbers, "", ivs)
    if ppo.above(-delta):
        return Claim(name, CONTRADICTED, numbers, "PPO's reward does not decline", ivs)
    if cory.below(0):
        return Claim(name, CONTRADICTED, numbers, "CORY's reward declines too", ivs)
    return Claim(name, INCONCLUSIVE, numbers, "the intervals do not decide", ivs)


def claim_combined(data: RunData, task: str, eta) -> Claim:
    """(4): CORY's combined reward rises over the run while PPO's falls."""
    name = f"(4) CORY's combined reward r − η·ΣKL rises while PPO's falls [{task}]"
    inp = _pair(data, task, eta, name)
    if isinstance(inp, Claim):
        return inp
    trend = {m: mean_interval([change(t.iterations, t.combined) for t in inp.per_seed(m)])
             for m in ("ppo", "cory")}
    eta_used = data.alone_eta(task)
    numbers = (f"change of the smoothed alone combined reward (η = {eta_used:g}) over the run "
               f"(least-squares slope × span): PPO {trend['ppo']}, CORY {trend['cory']}.")
    if inp.problem:
        return Claim(name, INCONCLUSIVE, numbers, inp.problem, trend)
    if trend["cory"].above(0) and trend["ppo"].below(0):
        return Claim(name, SUPPORTED, numbers, "", trend)
    if trend["cory"].below(0):
        return Claim(name, CONTRADICTED, numbers, "CORY's combined reward falls", trend)
    if trend["ppo"].above(0):
        return Claim(name, CONTRADICTED, numbers, "PPO's combined reward rises", trend)
    return Claim(name, INCONCLUSIVE, numbers, "an interval contains 0", trend)


def claim_ablations(data: RunData, task: str, eta) -> Claim:
    """(3): each ablation needs more KL than CORY at matched reward."""
    name = f"(3) no-knowledge-transfer and no-role-exchange need more KL than CORY [{task}]"
    missing = _missing(data, task, eta, ["cory", *ABLATIONS])
    if missing:
        return Claim(name, INCONCLUSIVE, "", f"not run: needs alone-evaluations of cory and "
                     f"{' and '.join(ABLATIONS)} on this task ({', '.join(missing)} missing)")
    inp = gather(data, task, eta, ["cory", *ABLATIONS])
    parts, statuses, ivs = [], [], {}
    for m in ABLATIONS:
        iv, levels = matched_kl_ratio(inp.per_seed(m), inp.per_seed("cory"))
        ivs[m] = iv
        statuses.append(verdict(iv, 0.0) if levels else INCONCLUSIVE)
        parts.append(f"KL_{m} / KL_CORY at rewards {_levels(levels)}: {ratio_text(iv)} "
                     f"({statuses[-1]})")
    numbers = "; ".join(parts) + "; threshold 1×."
    if inp.problem:
        return Claim(name, INCONCLUSIVE, numbers, inp.problem, ivs)
    if all(s == SUPPORTED for s in statuses):
        return Claim(name, SUPPORTED, numbers, "", ivs)
    if CONTRADICTED in statuses:
        return Claim(name, CONTRADICTED, numbers, "an ablation needs less KL", ivs)
    return Claim(name, INCONCLUSIVE, numbers, "an interval contains 1×", ivs)


def all_claims(data: RunData) -> list[Claim]:
    """Every claim check, per task (and per KL setting in a sweep)."""
    out = []
    for task in data.tasks():
        for eta in data.etas(task):
            group = [claim_kl_at_reward(data, task, eta), claim_reward_at_kl(data, task, eta)]
            if is_exact_match(task):
                group.append(claim_peak_decline(data, task, eta))
            group += [claim_ablations(data, task, eta), claim_combined(data, task, eta)]
            if eta is not None:
                for c in group:
                    c.name += f" (η={eta:g})"
            out += group
    if not any(is_exact_match(t) for t in data.tasks()):
        out.append(Claim("(2) PPO's reward peaks then declines, CORY's does not", INCONCLUSIVE,
                         "", "not run: needs an exact-match task (reasoning, arithmetic, "
                             "gsm8k, ...)"))
    return out
