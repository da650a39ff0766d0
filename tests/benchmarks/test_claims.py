"""The claim logic on synthetic alone-evaluation records whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import mechanism_measurement

from benchmarks.evidence import claims as cl
from benchmarks.evidence import intervals as iv_mod
from benchmarks.evidence import records as rec
from benchmarks.evidence import stats as st
from benchmarks.evidence import verdicts as vd
from benchmarks.evidence.trajectories import gather
from benchmarks.report import markdown as rp

ITERS = list(range(0, 44, 4))  # 11 evaluation points


def alone_rows(method, seed, rewards, kls, task="sentiment", models=("llm_0",), report_kl_coef=0.3,
               swept_kl_coef=None):
    """Alone-evaluation records of one seed (every model of the method gets the same curve)."""
    return [{"task": task, "method": method, "seed": seed, "swept_kl_coef": swept_kl_coef,
             "iteration": it, "agent": m, "task_reward": float(r), "kl": float(k),
             "combined_reward": float(r - report_kl_coef * k), "report_kl_coef": report_kl_coef}
            for it, r, k in zip(ITERS, rewards, kls) for m in models]


def runs(curves: dict, seeds=(0, 1, 2), task="sentiment") -> rec.RunData:
    """RunData from {method: f(seed) -> (rewards, kls)}; two-model methods for cory*."""
    rows = []
    for method, make in curves.items():
        models = ("llm_0", "llm_1") if method.startswith("cory") else ("llm_0",)
        for s in seeds:
            rewards, kls = make(s)
            rows += alone_rows(method, s, rewards, kls, task=task, models=models)
    metric_rows = [{"task": task, "method": m, "seed": s, "swept_kl_coef": None, "iteration": 0,
                    "agent": "llm_0", "role": "pioneer", "task_reward": 0.0, "kl": 0.0}
                   for m in curves for s in seeds]
    return rec.RunData(metric_rows, rows, window=1)


def claim(data, prefix):
    """The one claim whose name starts with the prefix."""
    (c,) = [c for c in cl.all_claims(data) if c.name.startswith(prefix)]
    return c


X = np.linspace(0, 1, len(ITERS))


def ppo_fast(s):
    """PPO: reward 0 -> 2 quickly, KL grows to 9 (noise by seed)."""
    return 2 * np.sqrt(X) + 0.01 * s, 9 * X + 0.05 * s


def cory_slow_efficient(s):
    """CORY: reward rises more slowly, but every reward costs a third of PPO's KL."""
    r = 2 * X ** 0.8 * 0.9 + 0.01 * s
    kl = 3 * (r / 2) ** 2 * (1 + 0.02 * s)  # PPO: kl = 9 (r/2)^2 -> ratio 3 at every reward
    return r, kl


# ------------------------------------------------------------------------------- (1a), (1b)
def test_a_method_that_dominates_the_frontier_is_supported_on_both_kl_claims():
    data = runs({"ppo": ppo_fast, "cory": lambda s: (ppo_fast(s)[0] + 0.2, ppo_fast(s)[1] / 3)})
    assert claim(data, "(1a)").status == vd.SUPPORTED
    assert claim(data, "(1b)").status == vd.SUPPORTED


def test_slower_but_more_kl_efficient_is_supported_not_read_as_worse():
    data = runs({"ppo": ppo_fast, "cory": cory_slow_efficient})
    # at any fixed iteration PPO has the higher reward ...
    p, c = data.trajectories("sentiment", "ppo", None)[0], \
        data.trajectories("sentiment", "cory", None)[0]
    assert (p.reward[1:] > c.reward[1:]).all()
    # ... but at matched reward it needs about 3x the KL
    c1a = claim(data, "(1a)")
    assert c1a.status == vd.SUPPORTED
    assert math.exp(c1a.intervals["value"].mean) == pytest.approx(3, rel=0.15)
    assert claim(data, "(1b)").status == vd.SUPPORTED


def test_a_less_efficient_cory_contradicts_the_kl_claims():
    data = runs({"ppo": lambda s: cory_slow_efficient(s), "cory": ppo_fast})
    assert claim(data, "(1a)").status == vd.CONTRADICTED
    assert claim(data, "(1a)").reason.startswith("CORY needs more KL than PPO")
    modest = runs({"ppo": ppo_fast, "cory": lambda s: (ppo_fast(s)[0], ppo_fast(s)[1] / 1.3)})
    c = claim(modest, "(1a)")  # 1.3x more efficient: the claim's 2x is still contradicted
    assert c.status == vd.CONTRADICTED and c.reason.startswith("CORY needs less KL, but not 2×")
    assert claim(data, "(1b)").status == vd.CONTRADICTED


def test_claim_1_is_contradicted_for_the_part_that_carries_the_evidence():
    """Rewards a little apart (the gap's interval straddles −δ) but KL clearly not halved: the
    reason is the KL ratio; rewards clearly apart at a KL ratio near 2×: the reward gap."""
    near = lambda s: (ppo_fast(s)[0] - 0.2 + (s - 1) * 0.15, ppo_fast(s)[1] / 0.75)  # noqa: E731
    c = claim(runs({"ppo": ppo_fast, "cory": near}), "(1) ")
    assert c.status == vd.CONTRADICTED and c.reason.startswith("the KL ratio is below 2×")
    apart = lambda s: (ppo_fast(s)[0] - 1.0 + 0.01 * s,  # noqa: E731
                       ppo_fast(s)[1] / (2.0 + (s - 1) * 0.8))
    c = claim(runs({"ppo": ppo_fast, "cory": apart}), "(1) ")
    assert c.status == vd.CONTRADICTED
    assert c.reason.startswith("the final rewards differ by more than ±δ")


def test_a_kl_ratio_near_the_threshold_is_inconclusive_with_its_reason():
    noisy = lambda s: (ppo_fast(s)[0], ppo_fast(s)[1] / (2.0 + (s - 1) * 0.8))  # noqa: E731
    c = claim(runs({"ppo": ppo_fast, "cory": noisy}), "(1a)")
    assert c.status == vd.INCONCLUSIVE and "reaches into 2× ×/÷ 1.1" in c.reason


# ------------------------------------------------------------------------------- (2)
def rise_then(shape, s):
    """A reward that rises to 0.5 by the third point, then follows `shape`."""
    up = np.minimum(X / X[2], 1.0) * 0.5
    tail = {"flat": 0.0, "decline": -0.4, "rise": 0.1}[shape]
    after = np.clip((X - X[2]) / (1 - X[2]), 0, 1) * tail
    return up + after + 0.01 * s, 5 * X + 0.1 * s


def test_peak_then_decline_is_supported():
    data = runs({"ppo": lambda s: rise_then("decline", s), "cory": lambda s: rise_then("rise", s)},
                task="arithmetic")
    assert claim(data, "(2)").status == vd.SUPPORTED


def test_a_flat_ppo_curve_contradicts_the_decline():
    data = runs({"ppo": lambda s: rise_then("flat", s), "cory": lambda s: rise_then("rise", s)},
                task="arithmetic")
    c = claim(data, "(2)")
    assert c.status == vd.CONTRADICTED and "does not decline" in c.reason


def test_cory_declining_as_well_contradicts_the_stability_claim():
    data = runs({"ppo": lambda s: rise_then("decline", s),
                 "cory": lambda s: rise_then("decline", s)}, task="arithmetic")
    c = claim(data, "(2)")
    assert c.status == vd.CONTRADICTED and "CORY" in c.reason


# ------------------------------------------------------------------------------- (3), (4)
def test_ablations_that_need_more_kl_at_matched_reward_are_supported():
    base = cory_slow_efficient
    data = runs({"ppo": ppo_fast, "cory": base,
                 "cory-no-kt": lambda s: (base(s)[0], base(s)[1] * 2),
                 "cory-no-re": lambda s: (base(s)[0], base(s)[1] * 1.5)})
    assert claim(data, "(3)").status == vd.SUPPORTED
    data = runs({"ppo": ppo_fast, "cory": base,
                 "cory-no-kt": lambda s: (base(s)[0], base(s)[1] * 0.5),
                 "cory-no-re": lambda s: (base(s)[0], base(s)[1] * 1.5)})
    assert claim(data, "(3)").status == vd.CONTRADICTED


def test_combined_reward_rising_for_cory_and_falling_for_ppo_is_supported():
    # eta 0.3: PPO's KL 9 eats its reward gain of 2; CORY's KL 1 does not
    data = runs({"ppo": lambda s: (2 * np.sqrt(X) + 0.01 * s, 12 * X ** 2 + 0.05 * s),
                 "cory": lambda s: (1.5 * X + 0.01 * s, X + 0.01 * s)})
    assert claim(data, "(4)").status == vd.SUPPORTED
    # CORY's KL 12 eats its reward gain of 1.5: its combined reward falls
    data = runs({"ppo": ppo_fast, "cory": lambda s: (1.5 * X + 0.01 * s, 12 * X + 0.01 * s)})
    c = claim(data, "(4)")
    assert c.status == vd.CONTRADICTED
    assert c.reason == "CORY's combined reward does not rise by more than δ"


# ------------------------------------------------------------------------------- honesty
def test_too_few_seeds_points_or_no_learning_make_every_claim_inconclusive():
    one_seed = runs({"ppo": ppo_fast, "cory": cory_slow_efficient}, seeds=(0,))
    for c in cl.all_claims(one_seed):
        assert c.status == vd.INCONCLUSIVE and c.reason, c.line()
    assert "too few seeds: 1 < 3" in claim(one_seed, "(1a)").reason
    flat = runs({"ppo": lambda s: (np.full(len(X), 0.2) + 0.01 * np.sin(X * 7 + s), 9 * X),
                 "cory": cory_slow_efficient})
    c = claim(flat, "(1a)")
    assert c.status == vd.INCONCLUSIVE and "ppo did not learn" in c.reason


def test_the_report_leads_with_the_verdicts_and_draws_the_frontier(tmp_path):
    data = runs({"ppo": ppo_fast, "cory": cory_slow_efficient})
    text = rp.render(data, rp.write_plots(data, tmp_path / "plots"))
    assert text.index("## The paper's claims") < text.index("## sentiment")
    assert "**supported**" in text and "95% CI" in text and "detectable" in text
    assert "| cory | llm_1 |" in text and "| base | – |" in text
    arms = text[text.index("against PPO on the reward–KL frontier"):]
    row = arms.splitlines()[4]
    assert row.startswith("| cory |") and "exploratory" in arms.splitlines()[0]
    assert float(row.split("|")[2].split("×")[0]) == pytest.approx(3, rel=0.05)  # 3x less KL
    for name in ("alone_sentiment.png", "frontier_sentiment.png", "curves_sentiment.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG", name


def test_the_mechanism_measurement_heads_the_report():
    measured = mechanism_measurement()
    lines = rp.mechanism_lines({"sentiment": measured, "imdb": {"not_measured": "user model"}})
    text = rp.render(runs({"ppo": ppo_fast, "cory": cory_slow_efficient}), preamble=lines)
    assert text.index("Cross-role transfer") < text.index("## The paper's claims")
    assert "does not hold on this model" in text and "imdb**: not measured" in text


def test_eta_sweep_records_make_a_pareto_plot_per_task(tmp_path):
    rows = []
    for eta, (reward, kl) in {1e-3: (0.9, 8.0), 1e-2: (0.6, 2.0)}.items():
        for seed in (0, 1):
            rows += alone_rows("ppo", seed, [0.1, reward], [0.0, kl], swept_kl_coef=eta)
    metric = [{"task": "sentiment", "method": "ppo", "seed": s, "swept_kl_coef": e, "iteration": 0,
               "agent": "llm_0", "role": "pioneer", "task_reward": 0.0, "kl": 0.0}
              for e in (1e-3, 1e-2) for s in (0, 1)]
    data = rec.RunData(metric, rows, window=1)
    plots = rp.write_plots(data, tmp_path)
    assert plots["sentiment|pareto"] == ["plots/pareto_sentiment.png"]
    assert (tmp_path / "pareto_sentiment.png").read_bytes()[:4] == b"\x89PNG"
    assert "kl_coef=0.01" in " ".join(c.name for c in cl.all_claims(data))


# ------------------------------------------------------------------------------- statistics
def test_intervals_frontiers_and_trends_match_hand_values():
    iv = iv_mod.mean_interval([1.0, 2.0, 3.0])  # mean 2, se 1/sqrt(3), t(2) = 4.303
    assert iv.mean == 2 and iv.high - 2 == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)
    assert iv.detectable == pytest.approx((4.3027 + 1.0607) / math.sqrt(3), rel=1e-4)
    assert not iv_mod.mean_interval([5.0]).above(0)  # one seed decides nothing
    assert st.smooth([0, 3, 6, 3]).tolist() == [1.5, 3, 4, 4.5]
    kl, r = [0, 1, 2, 4], [0, 1, 0.5, 3]
    assert st.reward_at_kl(kl, r, 1.5) == 1.0  # running max: the dip at KL 2 does not count
    assert [st.reward_at_kl(kl, r, k) for k in kl] == [0, 1, 1, 3]  # exact at the points
    assert math.isnan(st.reward_at_kl(kl, r, 5)) and math.isnan(st.kl_at_reward(kl, r, 4))
    # between points: the monotone cubic (PCHIP) in sqrt(KL). Nodes x = 0, 1, sqrt 2, 2 with
    # y = 0, 1, 1, 3; on [sqrt 2, 2] the slopes are 0 (flat side) and the end's 3-point value
    h, m = 2 - math.sqrt(2), 2 / (2 - math.sqrt(2))
    h0, d0 = math.sqrt(2) - 1, 0.0
    end = ((2 * h + h0) * m - h * d0) / (h + h0)  # scipy's one-sided end derivative
    end = 3 * m if end * m > 0 and abs(end) > abs(3 * m) else end
    t = (math.sqrt(3) - math.sqrt(2)) / h  # KL 3
    hermite = (-2 * t ** 3 + 3 * t ** 2) * 2 + (t ** 3 - t ** 2) * h * end + 1
    assert st.reward_at_kl(kl, r, 3) == pytest.approx(hermite, rel=1e-9)
    for target in (0.3, 0.9, 1.0, 2.0, 2.9):  # the KL for a reward is the exact inverse
        assert st.reward_at_kl(kl, r, st.kl_at_reward(kl, r, target)) == pytest.approx(target)
    assert st.kl_at_reward(kl, r, 1.0) == 1.0  # first reached at KL 1, not on the flat
    # a frontier linear in sqrt(KL) is read exactly however sparsely it is sampled
    for step in (0.5, 2.0):
        ks = np.arange(0, 16.01, step) ** 2 / 16
        assert st.reward_at_kl(ks, 0.3 * np.sqrt(ks), 2.2) == pytest.approx(0.3 * math.sqrt(2.2))
    assert st.change([0, 1, 2], [1, 3, 5]) == pytest.approx(4)


# ------------------------------------------------------------------------------- the audit
def test_a_seed_whose_kl_starts_high_drops_levels_not_the_seed():
    late = lambda s: (cory_slow_efficient(s)[0], cory_slow_efficient(s)[1] + (1.0 if s == 2  # noqa: E731
                                                                               else 0.0))
    c = claim(runs({"ppo": ppo_fast, "cory": late}), "(1b)")
    assert c.intervals["value"].n == 3  # every seed has a value on the shared KL range
    apart = runs({"ppo": lambda s: (ppo_fast(s)[0], 0.5 * X + 0.01 * s),
                  "cory": lambda s: (cory_slow_efficient(s)[0], 5 + 4 * X)})
    c = claim(apart, "(1b)")
    assert c.status == vd.INCONCLUSIVE and c.reason.startswith("no common KL range")


def test_one_frontier_sampled_fast_or_slow_gives_a_ratio_near_one():
    def on_frontier(speed):  # the same frontier kl = 9 (r/2)^2, walked at different speeds
        def make(s):
            r = 2 * np.minimum(1.0, X * speed) ** 0.5 * (1 + 0.005 * s)
            return r, 9 * (r / 2) ** 2
        return make

    c = claim(runs({"ppo": on_frontier(4.0), "cory": on_frontier(1.0)}), "(1a)")
    ratio = math.exp(c.intervals["value"].mean)
    assert 0.9 < ratio < 1.1 and c.status != vd.SUPPORTED
    assert math.isnan(st.kl_at_reward([1, 2, 4], [0.5, 1, 2], 0.2))  # below the first point


def test_a_negligible_cory_change_is_not_read_as_a_decline():
    def ppo(s):  # rises to 0.5, then falls by 0.4 (δ = 0.1 of the reward scale 1)
        return rise_then("decline", s)

    def cory(s):  # rises to 0.5, then drifts down by 0.013: inside the ±δ band
        r, kl = rise_then("flat", s)
        return r - 0.013 * np.clip((X - X[2]) / (1 - X[2]), 0, 1) * (1 + 0.1 * s), kl

    c = claim(runs({"ppo": ppo, "cory": cory}, task="arithmetic"), "(2)")
    assert c.status == vd.SUPPORTED, c.line()
    assert "(negligible)" in c.numbers and "PPO" in c.numbers and "(falls)" in c.numbers


def test_holm_adjusts_within_the_task_and_can_turn_a_raw_verdict_inconclusive():
    assert iv_mod.mean_interval([1.0]).p_above(0) == 1.0
    from benchmarks.evidence.intervals import holm

    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # CORY's KL 2.4x PPO's with wide seed noise: raw p < 0.05, but not after Holm over 5 claims
    noisy = lambda s: (ppo_fast(s)[0], ppo_fast(s)[1] * (1.2 + 0.55 * s))  # noqa: E731
    c = claim(runs({"ppo": ppo_fast, "cory": noisy}, seeds=(0, 1, 2, 3)), "(1b)")
    assert c.tested and c.p >= c.p_raw
    group = [x for x in cl.all_claims(runs({"ppo": ppo_fast, "cory": noisy}, seeds=(0, 1, 2, 3)))
             if x.tested]
    borderline = [x for x in group if x.p_raw < 0.05 <= x.p]
    for x in borderline:
        assert x.status == vd.INCONCLUSIVE and "Holm-adjusted" in x.reason
    assert all(x.p == pytest.approx(min(1, max(y.p_raw * (len(group) - i)
                                               for i, y in enumerate(sorted(
                                                   group, key=lambda g: g.p_raw))
                                               if y.p_raw <= x.p_raw)))
               for x in group)


def absent_mechanism() -> dict:
    """A measured mechanism whose cross-role transfer is absent (about 0.08)."""
    rows = [{"alone_base": 0.0, "alone_ppo": p, "alone_observer_only": o, "observer_base": 0.0,
             "observer_pioneer_only": 1.0, "observer_observer_only": 1.0}
            for p, o in ((1.0, 0.1), (1.1, 0.05), (0.9, 0.08))]
    return {"cross_role": {"per_seed": rows}}


def test_verdicts_say_on_this_model_and_carry_the_mechanism():
    data = runs({"ppo": ppo_fast, "cory": cory_slow_efficient})
    data.mechanism = {"sentiment": absent_mechanism()}
    c = claim(data, "(1a)")
    assert c.status == vd.SUPPORTED
    assert "**supported** on this model" in c.line() and "mechanism: absent" in c.line()
    assert "Detectable at these seeds" in c.line()


def test_did_not_learn_is_measured_from_the_base_models_own_point():
    def dips(s):  # the base scores 1.0; training drops it to 0 and it recovers to 0.6 only
        r = np.concatenate([[1.0], np.linspace(0.0, 0.6, len(X) - 1)]) + 0.01 * s
        return r, 9 * X
    c = claim(runs({"ppo": dips, "cory": cory_slow_efficient}), "(1a)")
    assert c.status == vd.INCONCLUSIVE and "ppo did not learn: its mean alone reward" in c.reason


def test_a_two_point_run_calls_every_claim_inconclusive_with_a_reason():
    rows = []
    for m in ("ppo", "cory", "cory-no-kt", "cory-no-re"):
        rows += alone_rows(m, 0, [0.1, 0.5], [0.0, 1.0], task="arithmetic")
    data = rec.RunData([{"task": "arithmetic", "method": m, "seed": 0, "swept_kl_coef": None,
                         "iteration": 0, "agent": "llm_0", "role": "pioneer"}
                        for m in ("ppo", "cory", "cory-no-kt", "cory-no-re")], rows, window=1)
    claims = cl.all_claims(data)
    assert len(claims) == 6
    for c in claims:
        assert c.status == vd.INCONCLUSIVE and "too few seeds: 1 < 3" in c.reason, c.line()
        assert "too few evaluation points: 2 < 5" in c.reason


def test_a_seed_still_running_is_left_out_not_read_as_too_few_points():
    data = runs({"ppo": ppo_fast, "cory": cory_slow_efficient}, seeds=(0, 1, 2))
    r, k = cory_slow_efficient(3)
    data.evals += alone_rows("cory", 3, r[:3], k[:3], models=("llm_0", "llm_1"))
    data.evals += alone_rows("ppo", 3, *ppo_fast(3))
    c = claim(data, "(1a)")
    assert c.status == vd.SUPPORTED and c.intervals["value"].n == 3


# ------------------------------------------------------------------------------- second audit
def trend(late, s):
    """Rises by 0.5 to the fourth point, then changes by about `late` over the second half."""
    up = np.minimum(X / X[3], 1.0) * 0.5
    slope = late / 0.5 * (1 + 0.04 * (s - 1))
    return 0.2 + up + slope * np.maximum(X - X[3], 0) + 0.01 * s, 5 * X + 0.1 * s


def claim_2(ppo_late, cory_late):
    """Claim (2) on an exact-match task with the two second-half changes."""
    return claim(runs({"ppo": lambda s: trend(ppo_late, s), "cory": lambda s: trend(cory_late, s)},
                      task="arithmetic"), "(2)")


def test_claim_2_needs_ppo_to_decline_and_cory_not_to():
    c = claim_2(+0.05, +0.35)  # PPO never declines: one contrast called this supported
    assert c.status == vd.CONTRADICTED
    assert c.reason == "PPO's reward does not decline by more than δ"
    c = claim_2(-0.5, -0.3)  # CORY declines too
    assert c.status == vd.CONTRADICTED and c.reason == "CORY's reward declines by more than δ"
    c = claim_2(-0.15, -0.08)  # PPO falls by more than δ = 0.1, CORY by less: both parts hold
    assert c.status == vd.SUPPORTED, c.line()
    assert "PPO -0.1" in c.numbers and "(falls)" in c.numbers and "(negligible)" in c.numbers
    assert c.p_for == max(c.intervals["ppo"].p_below(-0.1), c.intervals["cory"].p_above(-0.1))


def test_claim_2_reads_one_change_the_same_way_for_both_methods():
    """The earliest rule (PPO's change below 0, CORY's above −δ) called one negligible drift a
    decline for PPO and stability for CORY; one threshold, −δ, reads it the same for both."""
    c = claim_2(-0.05, -0.05)
    assert c.status == vd.CONTRADICTED
    assert c.reason == "PPO's reward does not decline by more than δ"
    assert c.numbers.count("(negligible)") == 2


def test_claim_2_inconclusive_names_the_undecided_part():
    noisy = lambda s: trend(-0.1 + 0.08 * (s - 1), s)  # noqa: E731  PPO's change straddles −δ
    c = claim(runs({"ppo": noisy, "cory": lambda s: trend(0.2, s)}, task="arithmetic"), "(2)")
    assert c.status == vd.INCONCLUSIVE
    assert c.reason.startswith("whether PPO's reward declines by more than δ is undecided")
    assert "CORY's reward does not decline by more than δ" in c.reason


def test_claim_4_needs_cory_to_rise_as_worded():
    """CORY 2.5x as KL-efficient as PPO, but its combined reward falls (PPO's falls more): the
    contrast alone called "CORY's rises while PPO's falls" supported."""
    def ppo(s):
        return 2 * np.sqrt(X) + 0.01 * s, 20 * X + 0.05 * s

    def cory(s):
        return 2 * np.sqrt(X) + 0.01 * s, 8 * X + 0.03 * s

    data = runs({"ppo": ppo, "cory": cory})
    c = claim(data, "(4)")
    assert c.intervals["cory"].below(-0.5) and c.intervals["ppo"].mean < c.intervals["cory"].mean
    assert c.status == vd.CONTRADICTED
    assert c.reason == "CORY's combined reward does not rise by more than δ"


def on_one_frontier(speed, shape=lambda k: 1 - np.exp(-k / 2)):
    """A method walking the frontier reward = shape(KL) at a speed, with no noise."""
    def make(s):
        kl = 4 * speed * X * (1 + 0.01 * s)
        return shape(kl), kl
    return make


@pytest.mark.parametrize("shape", [lambda k: 1 - np.exp(-k / 2), lambda k: np.log1p(k),
                                   lambda k: k / (k + 1), np.sqrt])
def test_one_frontier_at_two_speeds_gives_no_verdict_on_the_frontier_claims(shape):
    """CORY walks PPO's own frontier at half its speed: no method is better, so (1b) and (3)
    must not call one better (the zero threshold did, on interpolation artefacts)."""
    data = runs({"ppo": on_one_frontier(1.0, shape), "cory": on_one_frontier(0.5, shape),
                 "cory-no-kt": on_one_frontier(1.0, shape),
                 "cory-no-re": on_one_frontier(0.25, shape)})
    c1b = claim(data, "(1b)")
    assert c1b.status == vd.INCONCLUSIVE and "within ±δ" in c1b.reason, c1b.line()
    assert abs(c1b.intervals["value"].mean) < 0.01
    c3 = claim(data, "(3)")
    assert c3.status == vd.INCONCLUSIVE and "negligible" in c3.reason, c3.line()
    assert abs(c3.intervals["value"].mean) < 0.04  # within 4%; the margin is 10%
    c1a = claim(data, "(1a)")  # KL ratio 1 at matched reward: clearly not twice
    assert c1a.status == vd.CONTRADICTED and abs(c1a.intervals["value"].mean) < 0.06


def test_exactly_twice_the_kl_is_neither_supported_nor_contradicted():
    def cory(s):
        r, kl = on_one_frontier(1.0)(s)
        return r, kl / 2
    c = claim(runs({"ppo": on_one_frontier(1.0), "cory": cory}), "(1a)")
    assert c.status == vd.INCONCLUSIVE and "within 2× ×/÷ 1.1" in c.reason


def test_a_seed_missing_a_point_is_named_beside_every_verdict_it_touches():
    data = runs({"ppo": ppo_fast, "cory": cory_slow_efficient}, seeds=(0, 1, 2, 3, 4))
    data.evals = [r for r in data.evals  # seed 3 of CORY lost its last evaluation point
                  if not (r["method"] == "cory" and r["seed"] == 3 and r["iteration"] == 40)]
    for c in cl.all_claims(data):
        if c.name.startswith("(3)") or c.name.startswith("(2)"):
            continue  # (3) and (2) were not run here
        assert "seed 3 left out (cory has 10 of 11 evaluation points)" in c.line(), c.line()
    assert claim(data, "(1a)").intervals["value"].n == 4
    data.evals = [r for r in data.evals if not (r["method"] == "ppo" and r["seed"] == 4)]
    assert "seed 4 left out (no ppo records)" in claim(data, "(1b)").line()


def test_evaluation_noise_alone_does_not_pass_the_learning_gate():
    """Flat rewards whose best smoothed point lies above the base in every seed: the old gate
    (best point minus base) called that learning."""
    wiggle = np.array([0, 0.06, -0.06, 0.06, 0.06, -0.06, -0.06, 0.06, -0.06, 0.06, -0.06])

    def flat(s):
        return 0.2 + np.r_[0, np.roll(wiggle[1:], s)], 9 * X + 0.05 * s

    data = runs({"ppo": flat, "cory": cory_slow_efficient})
    inp = gather(data, "sentiment", None, ["ppo", "cory"])
    assert inp.best["ppo"].above(0)  # what the old gate read
    c = claim(data, "(1a)")
    assert c.status == vd.INCONCLUSIVE and "ppo did not learn measurably" in c.reason


def test_a_real_but_unproven_gain_is_not_worded_as_absence():
    gains = {0: 0.76, 1: 2.02, 2: 0.79}

    def ppo(s):  # each seed gains, but 3 seeds cannot show the mean above 0 at 95%
        return np.r_[0.0, np.full(len(X) - 1, gains[s])], 9 * X + 0.05 * s

    c = claim(runs({"ppo": ppo, "cory": cory_slow_efficient}), "(1a)")
    assert c.status == vd.INCONCLUSIVE
    assert "ppo's learning is not shown at 3 seeds" in c.reason
    assert "per seed +0.76, +2.02, +0.79" in c.reason and "did not learn:" not in c.reason


def test_claim_1s_margin_comes_from_the_methods_it_compares():
    data = runs({"ppo": ppo_fast, "cory": cory_slow_efficient})
    before = claim(data, "(1) ").numbers
    wide = runs({"ppo": ppo_fast, "cory": cory_slow_efficient,
                 "ppo-2x": lambda s: (10 * X, 9 * X)})
    assert claim(wide, "(1) ").numbers == before  # an exploratory arm changes no pre-stated test


def test_an_absent_mechanism_and_a_verdict_on_the_model_say_the_same():
    from benchmarks.evidence.transfer import MEANING

    data = runs({"ppo": ppo_fast, "cory": cory_slow_efficient})
    data.mechanism = {"sentiment": absent_mechanism()}
    c = claim(data, "(1a)")
    assert c.status == vd.SUPPORTED and "mechanism: absent" in c.line()
    assert "cannot be tested" not in MEANING["absent"]
    assert "still tested" in MEANING["absent"]


def test_a_plug_in_tasks_report_says_which_task_the_mechanism_was_measured_on():
    measured = {**mechanism_measurement(), "task": "sentiment"}
    lines = rp.mechanism_lines({"upbeat-short": measured, "sentiment": measured})
    text = "\n".join(lines)
    assert "**upbeat-short**: measured on task `sentiment`, whose model this task trains" in text
    assert "**sentiment**\n" in text + "\n"  # its own measurement needs no note
    data = runs({"ppo": ppo_fast, "cory": cory_slow_efficient}, task="upbeat-short")
    data.mechanism = {"upbeat-short": measured}
    assert "mechanism (measured on task sentiment):" in claim(data, "(1a)").line()


def test_a_figure_on_a_sliver_of_overlap_says_so_and_the_report_leads_with_one_line():
    far = runs({"ppo": lambda s: (3 * X + 0.01 * s, 20 * X ** 2 + 0.05 * s),
                "cory": lambda s: (0.2 * X + 0.01 * s, 0.5 * X + 0.01 * s)})
    assert "is a sliver" in claim(far, "(1a)").numbers
    assert "is a sliver" not in claim(runs({"ppo": ppo_fast, "cory": cory_slow_efficient}),
                                      "(1a)").numbers
    text = rp.render(runs({"ppo": ppo_fast, "cory": cory_slow_efficient}))
    first = text.splitlines()[2]
    assert first.startswith("**In one line:**") and "claims supported" in first
    assert "ppo +" in first and "cory +" in first


def test_prompts_cut_to_fit_are_named_in_the_report():
    data = runs({"ppo": ppo_fast, "cory": cory_slow_efficient})
    for r in data.rows:
        r.update(prompt_tokens_cut=6.0 if r["method"] == "cory" else 0.0,
                 prompt_cut_rate=1.0 if r["method"] == "cory" else 0.0)
    text = rp.render(data)
    assert "### Prompts cut to fit the window" in text
    assert "- **cory, pioneer**: 6 prompt tokens cut on average where any were, in 100%" in text
    assert "**ppo," not in text.split("### Prompts cut")[1].split("###")[0]


@pytest.mark.parametrize("make", [lambda p: p / "missing", lambda p: p])
def test_report_and_compare_refuse_a_folder_without_records_and_write_nothing(tmp_path, capsys,
                                                                             make):
    from benchmarks import compare

    folder = make(tmp_path)
    for cli in (rp.main, compare.main, lambda a: compare.main(["--same", *a, *a])):
        with pytest.raises(SystemExit) as exit_:
            cli([str(folder)])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and str(folder) in err and "no run records" in err
    assert not (folder / "report.md").exists() and not (tmp_path / "missing").exists()


def test_the_rounds_table_shows_every_round_and_says_which_no_game_reached():
    rows = [{"task": "game", "method": "ippo", "seed": s, "swept_kl_coef": None, "iteration": i,
             "agent": "llm_0", "role": "pioneer", "position": 0, "task_reward": 0.5, "kl": 0.1,
             "round_1_task_reward": 0.2, "round_1_kl": 0.05, "round_2_task_reward": 0.5,
             "round_2_kl": 0.05} for s in (0, 1) for i in range(3)]
    data = rec.RunData(rows, [], config={"train": {"rounds": 3}})
    table = "\n".join(rp.rounds_table(data, "game", None))
    assert "round 3 reward" in table and table.count("not reached") == 2
    one_seed = rec.mean_std([0.25])
    assert str(one_seed) == "0.25 (1 seed)"  # no "± 0" for a single seed


def test_n_agents_is_refused_when_no_method_runs_a_chain_and_said_when_some_do():
    from benchmarks.settings.config import resolve_config

    with pytest.raises(ValueError, match=r"--n-agents 3 sets the chain .* ppo train\(s\) one"):
        resolve_config("offline", methods=["ppo"], n_agents=3)
    with pytest.warns(UserWarning, match=r"--n-agents 3: ppo keep\(s\) one agent"):
        resolve_config("offline", methods=["ppo", "cory"], n_agents=3)


def test_the_base_row_is_one_value_per_seed_whatever_the_methods():
    """The base model is copied into every method's records of a seed: its spread is over the
    seeds (hand computed: seeds at 0.0 and 1.0 give 0.5 ± 0.707), not over method x seed
    copies, so two methods and six give the same row."""
    def data(methods):
        curves = {m: (lambda s: ([float(s)] + [2.0] * 10, [0.0] * 11)) for m in methods}
        return runs(curves, seeds=(0, 1))

    want = "| base | – | 0.5 ± 0.707 |"
    two = rp.alone_table(data(["ppo", "cory"]), "sentiment", None)
    six = rp.alone_table(data(["ppo", "cory", "grpo", "rloo", "ippo", "cory-grpo"]), "sentiment",
                         None)
    assert two[2].startswith(want) and six[2] == two[2], (two[2], six[2])


def test_a_six_method_report_opens_with_its_verdicts_and_a_ranking(tmp_path):
    """At six methods the report opens with every verdict in one table and the methods ranked
    by mean alone gain (best first), with the ranking figure; reasons several claims give
    word for word are said once; a frontier cell without a matched point says why."""
    gains = {"ppo": 1.0, "cory": 2.0, "grpo": 0.5, "rloo": 3.0, "ippo": 1.5, "cory-no-kt": 2.5}
    curves = {m: (lambda s, g=g: ([0.0] + [g + 0.1 * s] * 10, [0.1 * i for i in range(11)]))
              for m, g in gains.items()}
    data = runs(curves, seeds=(0, 1, 2))
    from benchmarks.report.plots import write_plots

    plots = write_plots(data, tmp_path / "plots")
    assert "plots/ranking_sentiment.png" in plots["sentiment|ranking"]
    assert (tmp_path / "plots" / "ranking_sentiment.png").stat().st_size > 0
    text = rp.render(data, plots)
    lines = text.splitlines()
    assert lines[4] == "## At a glance"
    assert lines[6] == "| claim | task | verdict | Holm-adjusted p |"
    ranked = [ln.split(" | ")[1] for ln in lines if ln.startswith("| ") and " | " in ln
              and ln.split(" | ")[0].lstrip("| ").isdigit()]
    assert ranked[:6] == ["rloo", "cory-no-kt", "cory", "ippo", "ppo", "grpo"]
    assert "![ranking](<plots/ranking_sentiment.png>)" in text
    assert text.index("## At a glance") < text.index("## The paper's claims")
    claim_lines = [ln for ln in lines if ln.startswith("- **(")]
    for said in {p for ln in claim_lines for p in ln.split("; ")}:
        if len(said) > 80:  # a long reason appears in one claim line at most
            assert sum(said in ln for ln in claim_lines) <= 1, said


def test_shared_reasons_are_said_once_and_cited():
    from benchmarks.evidence.verdicts import untested
    from benchmarks.report.summary import shared_reasons

    gate = "ppo's learning is not shown at 3 seeds (which does not say it did not learn)"
    claims = [untested("(1) a", f"{gate}; too few points"), untested("(2) b", gate),
              untested("(3) c", "its own reason")]
    lines, said = shared_reasons(claims)
    assert lines[2] == f"1. {gate}."
    assert [c.reason for c in said] == ["reason 1 above; too few points", "reason 1 above",
                                        "its own reason"]
