"""Where a study's time should go: the variance components of a paired contrast recovered from
records built with known ones, the evaluation's cost read from the log, and the allocation that
keeps the interval as narrow for less."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.allocate import main
from benchmarks.evidence.allocation import components, eval_seconds
from benchmarks.evidence.records import FORMAT, RunData

A = [-1.0, 0.0, 1.0]  # seed effects: variance 1
X = 0.1  # the point-by-seed wobble: ε = [[+x, −x], [−x, +x], [0, 0]]


def study(tmp_path):
    """cory − ppo alone rewards d(s, p) = a_s + b_p + ε(s, p) at iterations 3 and 6 (the base at
    0 is the same model in both arms), SE 0.02 a point over 64 openings; training 2 s an
    iteration; the log puts 6 s before each evaluation of cory's two models."""
    eps = [[X, -X], [-X, X], [0.0, 0.0]]
    evals, rows, log = [], [], []
    for s, a in enumerate(A):
        for j, it in enumerate((0, 3, 6)):
            d = 0.0 if it == 0 else a + 0.5 * j + eps[s][j - 1]
            for method, agents, r in (("cory", ("llm_0", "llm_1"), d), ("ppo", ("llm_0",), 0.0)):
                for agent in agents:
                    evals.append({"task": "reviews", "method": method, "seed": s,
                                  "swept_kl_coef": None, "agent": agent, "iteration": it,
                                  "run": f"reviews-{method}-seed{s}", "task_reward": r,
                                  "task_reward_se": 0.02 * math.sqrt(len(agents)),
                                  "n_queries": 64, "kl": 0.0, "combined_reward": r})
                    rows.append({"task": "reviews", "method": method, "seed": s, "agent": agent,
                                 "swept_kl_coef": None, "iteration": it, "time_rollout_s": 1.5,
                                 "time_update_s": 0.5})
            run = f"reviews-cory-seed{s}"
            log += [f"2026-12-06 10:0{s}:{10 * j:02d} {run} it {it}: llm_0(p) reward 0 [2.0s]",
                    f"2026-12-06 10:0{s}:{10 * j + 6:02d} {run} alone at iteration {it + 1}: "
                    f"llm_0 reward 0 kl 0, llm_1 reward 0 kl 0"]
    (tmp_path / "alone.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "run_config.json").write_text(json.dumps(
        {"format": FORMAT, "train": {"iterations": 6, "batch_size": 4}}))
    (tmp_path / "log.txt").write_text("\n".join(log) + "\n")
    return tmp_path


def test_the_components_are_the_ones_the_records_were_built_with(tmp_path):
    c = components(RunData.load(study(tmp_path)), "reviews", "cory", "ppo")
    opening = (0.02 * math.sqrt(2)) ** 2 / 2 + 0.02 ** 2  # cory's two models averaged, ppo's one
    assert (c.seeds, c.points, c.openings) == (3, 2, 64)
    assert c.opening == pytest.approx(opening)
    assert c.point == pytest.approx(max(2 * X ** 2 - opening, 0.0))  # Σε² / ((S−1)(P−1))
    assert c.seed == pytest.approx(1.0 - 2 * X ** 2 / 2)  # var(a) − Var(ε) / P
    assert c.variance(4, 256) == pytest.approx(c.seed + (c.point + opening / 4) / 4)


def test_the_evaluation_cost_comes_from_the_log(tmp_path):
    folder = study(tmp_path)
    assert eval_seconds(folder, RunData.load(folder), "reviews") == pytest.approx(3 * 256 / 64)


def test_the_command_prints_the_cheapest_allocation_no_wider_than_today(tmp_path, capsys):
    main([str(study(tmp_path)), "--task", "reviews", "--contrast", "cory,ppo"])
    out = capsys.readouterr().out
    assert "(today) |" in out and "cheapest no wider than today:" in out
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--task", "reviews", "--contrast", "cory"])
    assert "--contrast takes two methods" in capsys.readouterr().err
