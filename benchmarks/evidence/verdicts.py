"""How a claim is decided and said: a one-sided test for and against it at its threshold, claims
of several parts (an intersection-union test), matched-point sides, and Holm's correction over
a task's claims (`benchmarks.evidence.claims` states each claim and the rules).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmarks.evidence.intervals import ALPHA, Interval, detectable_effect, holm
from benchmarks.evidence.trajectories import MIN_SEEDS, Inputs

SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"
KL_MARGIN = math.log(1.1)  # a KL ratio within ×/÷ 1.1 of a threshold is negligible


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
    undecided: str = ""  # what an untested-by-Holm inconclusive means here
    note: str = ""  # seeds left out

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
        why = "; ".join(x for x in (self.reason, self.note, self.scope) if x)
        why = f" ({why})" if why else ""
        p = f" Holm-adjusted p = {self.p:.3g} (raw {self.p_raw:.3g})." if self.tested else ""
        mde = f" Detectable at these seeds: {self.detectable}." if self.detectable else ""
        return f"- **{self.name}**: **{self.status}**{where}{why}.{p} {self.numbers}{mde}".rstrip()


def untested(name: str, reason: str, numbers: str = "", **ivs: Interval) -> Claim:
    """A claim that could not be tested, with the reason."""
    return Claim(name, INCONCLUSIVE, numbers, reason, dict(ivs))


# ------------------------------------------------------------------------------- inputs
# ------------------------------------------------------------------------------- tests
def tested(name: str, numbers: str, inp: Inputs, p_for: float, p_against: float,
           ivs: dict[str, Interval], sizes: dict[str, Interval], threshold: str = "0",
           against: str = "", undecided: str = "") -> Claim:
    """A claim with its two p-values, or untested when the inputs forbid a verdict. `sizes`:
    the intervals whose detectable effects the report states; `against`: what a
    contradiction means; `undecided`: what an inconclusive verdict means (default: the
    interval contains the threshold)."""
    n = min((iv.n for iv in ivs.values()), default=0)
    if inp.problem:
        claim = untested(name, inp.problem, numbers, **ivs)
    elif n < MIN_SEEDS:
        claim = untested(name, f"only {n} seeds have a value on the shared range "
                               f"(< {MIN_SEEDS})", numbers, **ivs)
    else:
        claim = Claim(name, INCONCLUSIVE, numbers, "", ivs, p_for, p_against, sizes=sizes,
                      threshold=threshold, against=against, undecided=undecided)
    claim.note = inp.left_out
    return claim


def short(p_against: float, parts: int) -> str:
    """"" when a part's refutation p is below what contradicting a claim of `parts` parts
    needs, else the words that say it is shown at 95% only."""
    level = ALPHA / 2 / parts
    return "" if p_against < level else (f" (at 95%, short of the one-sided {100 * level:.2g}% "
                                         f"a claim of {parts} parts needs)")


@dataclass(frozen=True)
class Side:
    """One directional test with a margin: the effect `iv` is for the claim above `high` and
    against it below `low` (low == high: no margin), with what each outcome means."""

    iv: Interval
    low: float
    high: float
    says: str  # the claim's side, shown
    denies: str  # the other side, shown
    between: str  # neither shown
    above: bool = True  # False: the claim's side is below

    @property
    def p_for(self) -> float:
        """One-sided p of the claim's side."""
        return self.iv.p_above(self.high) if self.above else self.iv.p_below(self.low)

    @property
    def p_against(self) -> float:
        """One-sided p of the other side."""
        return self.iv.p_below(self.low) if self.above else self.iv.p_above(self.high)

    def state(self, parts: int = 1) -> str:
        """What the interval shows: the claim's side (at 95%), the other (at the level a
        contradiction of a claim of `parts` parts needs), or neither."""
        if self.p_for < ALPHA / 2:
            return self.says
        if self.p_against < ALPHA / 2:
            return self.denies + short(self.p_against, parts)
        return self.between


def sided(name: str, numbers: str, inp: Inputs, side: Side, shown: str, size: str) -> Claim:
    """A one-part claim decided by `side` (its margin between for and against)."""
    return tested(name, numbers, inp, side.p_for, side.p_against, {"value": side.iv},
                  {size: side.iv}, shown, side.denies, side.between)


def parts(name: str, numbers: str, inp: Inputs, sides: dict[str, Side], shown: str) -> Claim:
    """A claim of several parts (an intersection–union test): supported only when every part
    is (p the largest part's), contradicted when any part is refuted (Bonferroni over the
    parts); each reason names the parts that carry it."""
    p_for = max(s.p_for for s in sides.values())
    p_against = min(1.0, len(sides) * min(s.p_against for s in sides.values()))
    k = len(sides)
    against = "; ".join(s.denies for s in sides.values() if s.p_against < ALPHA / 2 / k)
    undecided = "; ".join(s.state(k) for s in sides.values())
    return tested(name, numbers, inp, p_for, p_against, {k: s.iv for k, s in sides.items()},
                  {k: s.iv for k, s in sides.items()}, shown, against, undecided)


def matched(name: str, numbers: str, inp: Inputs, side: Side, levels: list[float], axis: str
            ) -> Claim:
    """A frontier claim decided by `side` on levels of `axis` ("reward" or "KL") that every
    seed observed, or untested when they share no range."""
    if not levels and not inp.problem:
        what = "frontiers" if axis == "reward" else "KL ranges"
        claim = untested(name, f"no common {axis} range: the seeds' {what} do not overlap",
                         numbers, value=side.iv)
        claim.note = inp.left_out
        return claim
    shown = (f"{math.exp(side.high):.3g}× (for) and {math.exp(side.low):.3g}× (against)"
             if axis == "reward" else f"+{side.high:.3g} (for) and {side.low:.3g} (against)")
    return sided(name, numbers, inp, side, shown,
                 "log KL ratio" if axis == "reward" else "reward gap")


def kl_side(iv: Interval, at: float, who: str, than: str) -> Side:
    """"`who` needs more than `at`× the KL `than` does" on a log ratio, with the KL margin."""
    x = f"{math.exp(at):g}×"
    hi, lo = at + KL_MARGIN, at - KL_MARGIN
    needs = "need" if who.endswith("s") else "needs"  # "the ablations need", "PPO needs"
    denies = (f"{who} {needs} less KL than {than}" if at == 0 else
              "CORY needs more KL than PPO" if iv.below(0) else
              f"CORY needs less KL, but not {x} less" if iv.above(0) else
              f"the ratio is below {x} and its interval contains 1×")
    return Side(iv, lo, hi, f"{who} {needs} more than {math.exp(hi):.3g}× the KL of {than}",
                denies + f" (the ratio's interval lies below {math.exp(lo):.3g}×)",
                f"the ratio's interval reaches into {x} ×/÷ {math.exp(KL_MARGIN):.3g}"
                if not iv.within(lo, hi) else
                f"the ratio lies within {x} ×/÷ {math.exp(KL_MARGIN):.3g}: a negligible "
                f"difference from {x}")


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


def change_side(iv: Interval, who: str, what: str, at: float, above: bool) -> Side:
    """"`who`'s `what` changes above (or below) `at`" over the second half, as words."""
    up = (f"{who}'s {what} rises by more than δ" if at > 0 else
          f"{who}'s {what} does not decline by more than δ")
    down = (f"{who}'s {what} does not rise by more than δ" if at > 0 else
            f"{who}'s {what} declines by more than δ")
    says, denies = (up, down) if above else (down, up)
    return Side(iv, at, at, says, denies, f"whether {says} is undecided (the interval of its "
                                          f"change contains {at:+.3g})", above)


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
                        c.undecided or f"the interval contains {c.threshold}")
        level = alpha / len(live)
        c.detectable = ", ".join(
            f"{what} ±{detectable_effect(iv.se * math.sqrt(iv.n), iv.n, level):.3g}"
            for what, iv in c.sizes.items()) + (
            f" (80% power, two-sided at {level:.3g}: Holm's strictest level)")
    return group
