"""Each model read at its own pioneer iterations, on records whose answer is hand-computed."""

from __future__ import annotations

import pytest

from benchmarks.evidence import records as rec
from benchmarks.evidence.pioneer import pioneer_counts, read
from benchmarks.report import markdown as rp

POINTS = [0, 4, 8, 12, 16, 20]  # alone points; 20 training iterations, roles exchanged every 5


def first_at(agent, it, method):
    """Who answers first: cory exchanges every 5 iterations; one model otherwise."""
    if method == "cory":
        return agent == ("llm_0" if (it // 5) % 2 == 0 else "llm_1")
    return agent == "llm_0"


def data(methods=("ppo", "cory"), seeds=(0, 1, 2)) -> rec.RunData:
    """PPO's alone reward is 0.1 x its iteration; every other model's is 0.1 x the iterations
    it answered first (a seed's offset on every curve)."""
    rows, evals = [], []
    for method in methods:
        agents = ("llm_0",) if method in ("ppo", "ppo-2x") else ("llm_0", "llm_1")
        for seed in seeds:
            for agent in agents:
                for it in range(20):
                    first = first_at(agent, it, method)
                    rows.append({"task": "t", "method": method, "seed": seed, "swept_kl_coef": None,
                                 "iteration": it, "agent": agent,
                                 "role": "pioneer" if first else "observer",
                                 "position": 0 if first else 1})
                for point in POINTS:
                    n = point if method == "cory-shared" else \
                        sum(first_at(agent, i, method) for i in range(point))
                    r = 0.1 * n + 0.01 * seed
                    evals.append({"task": "t", "method": method, "seed": seed,
                                  "swept_kl_coef": None,
                                  "iteration": point, "agent": agent, "task_reward": r,
                                  "kl": 0.0, "combined_reward": r})
    return rec.RunData(rows, evals, window=1)


def test_pioneer_counts_are_the_iterations_before_each_point_in_which_the_model_was_first():
    rows = [{"iteration": it, "position": 0 if first_at("llm_1", it, "cory") else 1}
            for it in range(20)]
    assert pioneer_counts(rows, POINTS) == [0, 0, 3, 5, 6, 10]
    rows = [{"iteration": it, "role": "pioneer" if first_at("llm_0", it, "cory") else "observer"}
            for it in range(20)]  # records from before positions were written
    assert pioneer_counts(rows, POINTS) == [0, 4, 5, 7, 10, 10]


def test_a_model_learning_as_ppo_per_pioneer_iteration_reads_zero_there_and_behind_per_iteration():
    reading = read(data(), "t", None, "cory")
    assert reading.at_pioneer.mean == pytest.approx(0.0, abs=1e-12)
    assert reading.at_pioneer.low == pytest.approx(0.0, abs=1e-12)
    # by hand: llm_0 is 0, 3, 5, 6, 10 pioneer iterations behind at points 4..20, llm_1 4, 5, 7,
    # 10, 10: a mean of 6 behind, 0.1 reward each
    assert reading.at_iteration.mean == pytest.approx(-0.6)
    assert reading.span == (0, 10) and reading.points == 10
    report = rp.render(data())
    assert "### Each model at its own pioneer iterations" in report
    assert "| -0.6 [95% CI -0.6, -0.6; n=3 seeds" in report and "| 0–10 | 10 |" in report


def test_models_first_in_every_iteration_have_nothing_to_read():
    runs = data(("ppo", "ppo-2x", "cory-shared"))
    assert read(runs, "t", None, "ppo-2x") is None
    assert read(runs, "t", None, "cory-shared") is None  # one policy: pioneer every iteration
    assert "at its own pioneer iterations" not in rp.render(runs)
