"""The claim logic on synthetic alone-evaluation records whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import claims as cl
from benchmarks import records as rec
from benchmarks import report as rp
from benchmarks import stats as st

ITERS = list(range(0, 44, 4))  # 11 evaluation points


def alone_rows(method, seed, rewards, kls, task="sentiment", models=("llm_0",), eta=0.3,
               sweep_eta=None):
    """Alone-evaluation records of one seed (every model of the method gets the same curve)."""
    return [{"task": task, "method": method, "seed": seed, "sweep_eta": sweep_eta,
             "iteration": it, "model": m, "task_reward": float(r), "kl": float(k),
             "combined_reward": float(r - eta * k), "eta": eta}
            for it, r, k in zip(ITERS, rewards, kls) for m in models]


def runs(curves: dict, seeds=(0, 1, 2), task="sentiment") -> rec.RunData:
    """RunData from {method: f(seed) -> (rewards, kls)}; two-model methods for cory*."""
    rows = []
    for method, make in curves.items():
        models = ("llm_0", "llm_1") if method.startswith("cory") else ("llm_0",)
        for s in seeds:
            rewards, kls = make(s)
            rows += alone_rows(method, s, rewards, kls, task=task, models=models)
    metric_rows = [{"task": task, "method": m, "seed": s, "sweep_eta": None, "iteration": 0,
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
    assert claim(data, "(1a)").status == cl.SUPPORTED
    assert claim(data, "(1b)").status == cl.SUPPORTED


def test_slower_but_more_kl_efficient_is_supported_not_read_as_worse():
    data = runs({"ppo": ppo_fast, "cory": cory_slow_efficient})
    # at any fixed iteration PPO has the higher reward ...
    p, c = data.trajectories("sentiment", "ppo", None)[0], \
        data.trajectories("sentiment", "cory", None)[0]
    assert (p.reward[1:] > c.reward[1:]).all()
    # ... but at matched reward it needs about 3x the KL
    c1a = claim(data, "(1a)")
    assert c1a.status == cl.SUPPORTED
    assert math.exp(c1a.intervals["value"].mean) == pytest.approx(3, rel=0.15)
    assert claim(data, "(1b)").status == cl.SUPPORTED


def test_a_less_efficient_cory_contradicts_the_kl_claims():
    data = runs({"ppo": lambda s: cory_slow_efficient(s), "cory": ppo_fast})
    assert claim(data, "(1a)").status == cl.CONTRADICTED
    assert claim(data, "(1a)").reason == "CORY needs more KL than PPO"
    modest = runs({"ppo": ppo_fast, "cory": lambda s: (ppo_fast(s)[0], ppo_fast(s)[1] / 1.3)})
    c = claim(modest, "(1a)")  # 1.3x more efficient: the claim's 2x is still contradicted
    assert c.status == cl.CONTRADICTED and c.reason == "CORY needs less KL, but not half"
    assert claim(data, "(1b)").status == cl.CONTRADICTED


def test_a_kl_ratio_near_the_threshold_is_inconclusive_with_its_reason():
    noisy = lambda s: (ppo_fast(s)[0], ppo_fast(s)[1] / (2.0 + (s - 1) * 0.8))  # noqa: E731
    c = claim(runs({"ppo": ppo_fast, "cory": noisy}), "(1a)")
    assert c.status == cl.INCONCLUSIVE and "contains 2.0×" in c.reason


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
    assert claim(data, "(2)").status == cl.SUPPORTED


def test_a_flat_ppo_curve_contradicts_the_decline():
    data = runs({"ppo": lambda s: rise_then("flat", s), "cory": lambda s: rise_then("rise", s)},
                task="arithmetic")
    c = claim(data, "(2)")
    assert c.status == cl.CONTRADICTED and "does not decline" in c.reason


def test_cory_declining_as_well_contradicts_the_stability_claim():
    data = runs({"ppo": lambda s: rise_then("decline", s),
                 "cory": lambda s: rise_then("decline", s)}, task="arithmetic")
    c = claim(data, "(2)")
    assert c.status == cl.CONTRADICTED and "CORY" in c.reason


# ------------------------------------------------------------------------------- (3), (4)
def test_ablations_that_need_more_kl_at_matched_reward_are_supported():
    base = cory_slow_efficient
    data = runs({"ppo": ppo_fast, "cory": base,
                 "cory-no-kt": lambda s: (base(s)[0], base(s)[1] * 2),
                 "cory-no-re": lambda s: (base(s)[0], base(s)[1] * 1.5)})
    assert claim(data, "(3)").status == cl.SUPPORTED
    data = runs({"ppo": ppo_fast, "cory": base,
                 "cory-no-kt": lambda s: (base(s)[0], base(s)[1] * 0.5),
                 "cory-no-re": lambda s: (base(s)[0], base(s)[1] * 1.5)})
    assert claim(data, "(3)").status == cl.CONTRADICTED


def test_combined_reward_rising_for_cory_and_falling_for_ppo_is_supported():
    # eta 0.3: PPO's KL 9 eats its reward gain of 2; CORY's KL 1 does not
    data = runs({"ppo": lambda s: (2 * np.sqrt(X) + 0.01 * s, 12 * X ** 2 + 0.05 * s),
                 "cory": lambda s: (1.5 * X + 0.01 * s, X + 0.01 * s)})
    assert claim(data, "(4)").status == cl.SUPPORTED
    # CORY's KL 12 eats its reward gain of 1.5: its combined reward falls
    data = runs({"ppo": ppo_fast, "cory": lambda s: (1.5 * X + 0.01 * s, 12 * X + 0.01 * s)})
    c = claim(data, "(4)")
    assert c.status == cl.CONTRADICTED and "CORY's combined reward falls" in c.reason


# ------------------------------------------------------------------------------- honesty
def test_too_few_seeds_points_or_no_learning_make_every_claim_inconclusive():
    one_seed = runs({"ppo": ppo_fast, "cory": cory_slow_efficient}, seeds=(0,))
    for c in cl.all_claims(one_seed):
        assert c.status == cl.INCONCLUSIVE and c.reason, c.line()
    assert "too few seeds: 1 < 3" in claim(one_seed, "(1a)").reason
    flat = runs({"ppo": lambda s: (np.full(len(X), 0.2) + 0.01 * np.sin(X * 7 + s), 9 * X),
                 "cory": cory_slow_efficient})
    c = claim(flat, "(1a)")
    assert c.status == cl.INCONCLUSIVE and "ppo did not learn" in c.reason


def test_the_report_leads_with_the_verdicts_and_draws_the_frontier(tmp_path):
    data = runs({"ppo": ppo_fast, "cory": cory_slow_efficient})
    text = rp.render(data, rp.write_plots(data, tmp_path / "plots"))
    assert text.index("## The paper's claims") < text.index("## sentiment")
    assert "**supported**" in text and "95% CI" in text and "detectable" in text
    assert "| cory | llm_1 |" in text and "| base | – |" in text
    arms = text[text.index("against PPO on the reward–KL frontier"):]
    assert arms.splitlines()[4].startswith("| cory | 3")  # ~3x less KL than PPO
    for name in ("alone_sentiment.png", "frontier_sentiment.png", "curves_sentiment.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG", name


def test_the_mechanism_measurement_heads_the_report():
    iv = {"mean": 0.1, "low": 0.05, "high": 0.15, "n": 3, "detectable": 0.05}
    measured = {"knowledge_transfer": {"from_answer": iv, "from_instruction": iv, "total": iv},
                "cross_role": {"ratio": iv, "reverse": iv, "per_seed": [{"ratio": 0.1}] * 3,
                               **{f"gain_{k}": iv for k in ("alone_ppo", "alone_observer_only",
                                                            "as_observer_pioneer_only",
                                                            "as_observer_observer_only")}},
                "verdict": "absent", "queries": 128, "seeds": [0, 1, 2],
                "budget": {"iterations": 20, "batch_size": 32, "lr": 1e-4}}
    lines = rp.mechanism_lines({"sentiment": measured, "imdb": {"not_measured": "user model"}})
    text = rp.render(runs({"ppo": ppo_fast, "cory": cory_slow_efficient}), preamble=lines)
    assert text.index("Cross-role transfer") < text.index("## The paper's claims")
    assert "cannot be tested on this model" in text and "imdb**: not measured" in text


def test_eta_sweep_records_make_a_pareto_plot_per_task(tmp_path):
    rows = []
    for eta, (reward, kl) in {1e-3: (0.9, 8.0), 1e-2: (0.6, 2.0)}.items():
        for seed in (0, 1):
            rows += alone_rows("ppo", seed, [0.1, reward], [0.0, kl], sweep_eta=eta)
    metric = [{"task": "sentiment", "method": "ppo", "seed": s, "sweep_eta": e, "iteration": 0,
               "agent": "llm_0", "role": "pioneer", "task_reward": 0.0, "kl": 0.0}
              for e in (1e-3, 1e-2) for s in (0, 1)]
    data = rec.RunData(metric, rows, window=1)
    plots = rp.write_plots(data, tmp_path)
    assert plots["sentiment|pareto"] == ["plots/pareto_sentiment.png"]
    assert (tmp_path / "pareto_sentiment.png").read_bytes()[:4] == b"\x89PNG"
    assert "η=0.01" in " ".join(c.name for c in cl.all_claims(data))


# ------------------------------------------------------------------------------- statistics
def test_intervals_frontiers_and_trends_match_hand_values():
    iv = st.mean_interval([1.0, 2.0, 3.0])  # mean 2, se 1/sqrt(3), t(2) = 4.303
    assert iv.mean == 2 and iv.high - 2 == pytest.approx(4.303 / math.sqrt(3))
    assert iv.detectable == pytest.approx((4.303 + 1.061) / math.sqrt(3))
    assert not st.mean_interval([5.0]).above(0)  # one seed decides nothing
    assert st.smooth([0, 3, 6, 3]).tolist() == [1.5, 3, 4, 4.5]
    kl, r = [0, 1, 2, 4], [0, 1, 0.5, 3]
    assert st.reward_at_kl(kl, r, 1.5) == 1.0  # running max: the dip at KL 2 does not count
    assert st.reward_at_kl(kl, r, 3) == 2.0 and math.isnan(st.reward_at_kl(kl, r, 5))
    assert st.kl_at_reward(kl, r, 0.5) == 0.5 and st.kl_at_reward(kl, r, 2) == pytest.approx(3)
    assert math.isnan(st.kl_at_reward(kl, r, 4))
    assert st.change([0, 1, 2], [1, 3, 5]) == pytest.approx(4)
