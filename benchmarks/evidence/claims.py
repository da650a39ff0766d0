"""The paper's claims, each decided by one pre-stated test on the models answering alone.

Every claim reads the alone-evaluation points (`alone.jsonl`: every model of every method
answering held-out queries alone every `eval_every` iterations), one trajectory per seed: a
multi-model method's trajectory is the mean of its models at each point ("a CORY-trained
model, either one"); trends and final points read it smoothed over points, frontiers read the
raw points (`benchmarks.evidence.stats`). Per seed, paired by seed. δ is MEANINGFUL (10%) of
the reward scale of the methods a claim compares (1 on exact-match tasks), and a KL ratio within
KL_MARGIN (×/÷ 1.1) of a threshold is negligible:

(1) similar final reward, PPO's KL more than twice CORY's: the final rewards are equivalent
    within ±δ (two one-sided tests) *and* log(KL_PPO / KL_CORY) at the final point is above
    log 2 by more than the KL margin.
(1a) at matched reward, log(KL_PPO / KL_CORY) above log 2 by more than the KL margin
    (contradicted: below it by more than the margin).
(1b) at matched KL, reward_CORY − reward_PPO > δ (contradicted: < −δ, CORY lower).
(2) exact-match tasks, PPO's reward peaks then declines while CORY's does not, two parts
    (an intersection–union test): over the second half of the points PPO's change < −δ, *and*
    CORY's change > −δ. Both parts use the one threshold −δ: a change counts as a decline
    only when it falls by more than δ.
(3) both ablations need more KL than CORY: the mean over cory-no-kt and cory-no-re of
    log(KL_ablation / KL_CORY) at matched reward above the KL margin (contradicted: below
    minus the margin).
(4) CORY's combined reward r − c·ΣKL rises while PPO's falls, two parts: over the second half
    CORY's change > δ *and* PPO's change < −δ.

A claim with one part gives a one-sided p-value for it and one against it at its threshold;
(1a), (1b) and (3) test "for" and "against" at thresholds a margin apart, so that an effect
inside the margin (an interpolation artefact, a negligible difference) is neither. A claim of
parts is supported only when every part is (its p is the largest part's) and contradicted
when any part is refuted (Bonferroni over the parts). The claim's p is twice the smaller of
the two, so that before correction a verdict is a 95% interval lying clear of its threshold.
Within each task, Holm's method adjusts the p-values of the claims that could be tested; a
claim is *supported* or *contradicted* on this model only when its adjusted p < 0.05, and
*inconclusive* otherwise, or with fewer than 3 seeds, fewer than 5 evaluation points, no
shared range to match, or a method whose learning is not shown: a one-sided t-test over seeds
(at 2.5%) of its mean alone reward over the points after the base minus the base model's
(the raw first point); a gain within ±δ reads "does not learn measurably", a wider interval
"not shown at these seeds". A seed without every evaluation point of every compared method is
left out, and each verdict it touches names it. Each claim states the effect it could detect
at these seeds, and the report puts the model's measured mechanism beside every verdict.
"""

from __future__ import annotations

import math

import numpy as np

from agents.learners.registry import ablation_methods
from benchmarks.evidence.frontier import (
    levels_text,
    log_kl,
    log_kl_ratios,
    matched_kl_ratio,
    matched_reward_gap,
    ratio_text,
    reward_levels,
    sliver,
)
from benchmarks.evidence.intervals import ALPHA, Interval, mean_interval
from benchmarks.evidence.records import RunData, Trajectory
from benchmarks.evidence.stats import change
from benchmarks.evidence.trajectories import Inputs, gather, missing_methods
from benchmarks.evidence.transfer import summarize
from benchmarks.evidence.verdicts import (
    KL_MARGIN,
    Claim,
    Side,
    band,
    change_side,
    decide,
    kl_side,
    matched,
    parts,
    short,
    tested,
    untested,
)

KL_RATIO = 2.0  # claim (1)'s "more than twice"


def _pair(data: RunData, task: str, kl_coef, name: str) -> Inputs | Claim:
    """PPO's and CORY's inputs, or the inconclusive claim when either was not run."""
    if missing_methods(data, task, kl_coef, ["ppo", "cory"]):
        return untested(name, "not run: needs alone-evaluations of ppo and cory on this task")
    return gather(data, task, kl_coef, ["ppo", "cory"])


def final_point(t: Trajectory, field_: str) -> float:
    """A smoothed trajectory's last point of one field."""
    return float(getattr(t, field_)[-1])


def claim_efficiency(data: RunData, task: str, kl_coef) -> Claim:
    """(1): equivalent final reward and log(KL_PPO / KL_CORY) at it above log 2 (the margin)."""
    name = f"(1) similar final reward, and PPO's KL more than twice CORY's at it [{task}]"
    inp = _pair(data, task, kl_coef, name)
    if isinstance(inp, Claim):
        return inp
    ppo, cory = inp.per_seed("ppo"), inp.per_seed("cory")
    gap = mean_interval([final_point(c, "reward") - final_point(p, "reward")
                         for p, c in zip(ppo, cory)])
    ratio = mean_interval([log_kl(final_point(p, "kl")) - log_kl(final_point(c, "kl"))
                           for p, c in zip(ppo, cory)])
    d, lk = inp.delta, math.log(KL_RATIO)
    p_equal = max(gap.p_above(-d), gap.p_below(d))  # two one-sided tests
    p_for = max(p_equal, ratio.p_above(lk + KL_MARGIN))  # both parts must hold
    apart, below = min(gap.p_below(-d), gap.p_above(d)), ratio.p_below(lk - KL_MARGIN)
    p_against = min(1.0, 3 * min(apart, below))
    numbers = (f"Final reward CORY − PPO {gap} (tested for equivalence within ±δ = {d:.3g}, 10% "
               f"of the reward scale {inp.scale:.3g}); KL_PPO / KL_CORY at the final point "
               f"{ratio_text(ratio)} (threshold {KL_RATIO:g}× ×/÷ {math.exp(KL_MARGIN):.3g}). "
               f"Mean gains over the base: PPO {inp.gains['ppo']}, CORY {inp.gains['cory']}.")
    against = ("the final rewards differ by more than ±δ" if apart < below else  # the evidence
               f"the KL ratio is below {KL_RATIO:g}×")
    reward = ("the final rewards are equivalent within ±δ" if p_equal < ALPHA / 2 else
              "the final rewards differ by more than ±δ" + short(apart, 3) if apart < ALPHA / 2
              else "whether the final rewards are within ±δ is undecided")
    kl = kl_side(ratio, lk, "PPO", "CORY").state(parts=3)
    return tested(name, numbers, inp, p_for, p_against, {"reward_gap": gap, "log_kl_ratio": ratio},
                  {"reward gap": gap, "log KL ratio": ratio},
                  f"±{d:.3g} and {KL_RATIO:g}×", against, f"{reward}; {kl}")


def claim_kl_at_reward(data: RunData, task: str, kl_coef) -> Claim:
    """(1a): at matched reward, PPO's KL > 2x CORY's (by more than the KL margin)."""
    name = f"(1a) at matched reward, PPO's KL is more than twice CORY's [{task}]"
    inp = _pair(data, task, kl_coef, name)
    if isinstance(inp, Claim):
        return inp
    iv, levels = matched_kl_ratio(inp.points("ppo"), inp.points("cory"))
    numbers = (f"KL_PPO / KL_CORY at rewards {levels_text(levels)} (25-100% of the best-reward"
               f" range every seed observed): {ratio_text(iv)}; threshold {KL_RATIO:g}× ×/÷ "
               f"{math.exp(KL_MARGIN):.3g}." + sliver(inp.points("ppo") + inp.points("cory"),
                                                       "reward"))
    return matched(name, numbers, inp, kl_side(iv, math.log(KL_RATIO), "PPO", "CORY"), levels,
                   "reward")


def claim_reward_at_kl(data: RunData, task: str, kl_coef) -> Claim:
    """(1b): at matched KL, CORY's reward higher than PPO's by more than δ."""
    name = f"(1b) at matched KL, CORY's reward is higher than PPO's [{task}]"
    inp = _pair(data, task, kl_coef, name)
    if isinstance(inp, Claim):
        return inp
    iv, budgets = matched_reward_gap(inp.points("cory"), inp.points("ppo"))
    d = inp.delta
    numbers = (f"reward_CORY − reward_PPO at KL {levels_text(budgets)} nats (25-100% of the KL"
               f" range every seed observed): {iv}; threshold ±δ = {d:.3g} (10% of the reward "
               f"scale {inp.scale:.3g})." + sliver(inp.points("ppo") + inp.points("cory"), "kl"))
    between = ("the gap lies within ±δ: no meaningful difference" if iv.within(-d, d) else
               "the gap's interval reaches into ±δ")
    side = Side(iv, -d, d, "CORY's reward is higher by more than δ",
                "CORY's reward is lower than PPO's by more than δ", between)
    return matched(name, numbers, inp, side, budgets, "KL")


def late_change(traj: Trajectory, field_: str = "reward") -> float:
    """A trajectory's change over its second half of evaluation points (at least 3 points)."""
    n = len(traj.iterations)
    start = min(n // 2, max(n - 3, 0))
    return change(traj.iterations[start:], getattr(traj, field_)[start:])


def _changes(inp: Inputs, field_: str) -> tuple[dict[str, Interval], str]:
    """Each method's second-half change, and as text against the band ±δ."""
    each = {m: mean_interval([late_change(t, field_) for t in inp.per_seed(m)])
            for m in ("ppo", "cory")}
    text = "; ".join(f"{m.upper()} {iv} ({band(iv, inp.delta)})" for m, iv in each.items())
    return each, text


def claim_peak_decline(data: RunData, task: str, kl_coef) -> Claim:
    """(2): over the second half, PPO's reward declines by more than δ and CORY's does not."""
    name = f"(2) PPO's reward peaks then declines, CORY's does not [{task}]"
    inp = _pair(data, task, kl_coef, name)
    if isinstance(inp, Claim):
        return inp
    each, text = _changes(inp, "reward")
    d = inp.delta
    numbers = (f"Change of the smoothed alone reward over the second half, against the band "
               f"±δ (δ = {d:.3g}, 10% of the reward scale {inp.scale:.3g}): {text}.")
    sides = {"ppo": change_side(each["ppo"], "PPO", "reward", -d, above=False),
             "cory": change_side(each["cory"], "CORY", "reward", -d, above=True)}
    return parts(name, numbers, inp, sides, f"−δ = {-d:.3g}")


def claim_combined(data: RunData, task: str, kl_coef) -> Claim:
    """(4): over the second half, CORY's combined reward rises by more than δ, PPO's falls."""
    name = f"(4) CORY's combined reward r − c·ΣKL rises while PPO's falls [{task}]"
    inp = _pair(data, task, kl_coef, name)
    if isinstance(inp, Claim):
        return inp
    each, text = _changes(inp, "combined")
    d = inp.delta
    numbers = (f"Change of the smoothed alone combined reward (c = report_kl_coef = "
               f"{data.report_kl_coef(task):g}) "
               f"over the second half, against the band ±δ (δ = {d:.3g}): {text}.")
    sides = {"cory": change_side(each["cory"], "CORY", "combined reward", d, above=True),
             "ppo": change_side(each["ppo"], "PPO", "combined reward", -d, above=False)}
    return parts(name, numbers, inp, sides, f"±δ = {d:.3g}")


def claim_ablations(data: RunData, task: str, kl_coef) -> Claim:
    """(3): the ablations' mean log(KL_ablation / KL_CORY) at matched reward above the margin."""
    name = f"(3) no-knowledge-transfer and no-role-exchange need more KL than CORY [{task}]"
    ablations = ablation_methods()
    missing = missing_methods(data, task, kl_coef, ["cory", *ablations])
    if missing:
        return untested(name, f"not run: needs alone-evaluations of cory and "
                              f"{' and '.join(ablations)} on this task ({', '.join(missing)} "
                              f"missing)")
    inp = gather(data, task, kl_coef, ["cory", *ablations])
    cory = inp.points("cory")
    levels = reward_levels(cory + [t for m in ablations for t in inp.points(m)])
    each = {m: log_kl_ratios(inp.points(m), cory, levels) for m in ablations}
    both = mean_interval([float(np.mean(x)) for x in zip(*each.values())])
    parts_ = "; ".join(f"{m} {ratio_text(mean_interval(v))}" for m, v in each.items())
    numbers = (f"KL_ablation / KL_CORY at rewards {levels_text(levels)}, the geometric mean of"
               f" both: {ratio_text(both)} (threshold 1× ×/÷ {math.exp(KL_MARGIN):.3g}); each "
               f"(exploratory): {parts_}.")
    return matched(name, numbers, inp, kl_side(both, 0.0, "the ablations", "CORY"), levels,
                   "reward")


# ------------------------------------------------------------------------------- verdicts
def mechanism_scope(data: RunData, task: str) -> str:
    """The model's measured mechanism, as the scope of a verdict."""
    m = data.mechanism.get(task)
    if not m or "not_measured" in m:
        return "mechanism not measured on this model"

    s = summarize(m)
    where = f" (measured on task {m['task']})" if m.get("task") not in (None, task) else ""
    return f"mechanism{where}: {s['verdict']}, cross-role transfer {s['ratio_text']}"


def all_claims(data: RunData) -> list[Claim]:
    """Every claim check, per task (and per KL setting in a sweep), Holm-adjusted per group."""
    out = []
    for task in data.tasks():
        exact = data.exact_match(task)
        for kl_coef in data.kl_coefs(task):
            group = [claim_efficiency(data, task, kl_coef), claim_kl_at_reward(data, task, kl_coef),
                     claim_reward_at_kl(data, task, kl_coef)]
            if exact:
                group.append(claim_peak_decline(data, task, kl_coef))
            group += [claim_ablations(data, task, kl_coef), claim_combined(data, task, kl_coef)]
            scope = mechanism_scope(data, task)
            for c in decide(group):
                c.scope = scope
                if kl_coef is not None:
                    c.name += f" (kl_coef={kl_coef:g})"
            out += group
    if not any(data.exact_match(t) for t in data.tasks()):
        out.append(untested("(2) PPO's reward peaks then declines, CORY's does not",
                            "not run: needs an exact-match task (reasoning, arithmetic, "
                            "gsm8k, ...)"))
    return out
