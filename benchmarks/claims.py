"""The paper's claims, each checked against a run's records with a stated verdict.

(1) similar task reward with PPO's KL more than twice CORY's; (2) PPO's reward peaks then
declines while CORY's stays stable (math tasks); (3) the no-knowledge-transfer and
no-role-exchange ablations raise KL. "Similar", "declines" and "raises" use a margin of 10% of
the task's reward range or one standard deviation over seeds, whichever is larger.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .records import RunData, Stat, curves, fmt, mean_curve, moving_average

REPRODUCED, NOT_REPRODUCED, NOT_RUN = "reproduced", "not reproduced at this scale", "not run"
MATH_TASKS = ("arithmetic", "gsm8k")
SIMILAR_FRACTION = 0.10  # "similar" / "declines" / "raises": 10% of the range (or 1 std)
ABLATIONS = ("cory-no-kt", "cory-no-re")


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
