"""Every exercise in docs/exercises.md runs, and its solution behaves as the page says."""

from __future__ import annotations

import warnings

import pytest
import torch
from pettingzoo.test import api_test

import cory_env
from examples.exercises import ex1_learner, ex2_rewards, ex3_structure, ex4_task


def test_ex1_own_learner_learns():
    curve = ex1_learner.main(["--iterations", "8"])
    assert sum(curve[-2:]) / 2 > sum(curve[:2]) / 2 + 0.4, curve


def test_ex2_difference_rewards_remove_the_other_agents_noise():
    own = torch.tensor([1.0, 0.0, 2.0, 1.0])
    other = torch.tensor([5.0, -3.0, 0.0, 2.0])
    d = ex2_rewards.difference_rewards(own, own + other)
    torch.testing.assert_close(d, own - own.mean())  # no trace of the other agent
    out = ex2_rewards.main(["--iterations", "2"])
    assert set(out) == {"cory", "cory-individual", "ippo-difference"}


def test_ex3_structure_flags_change_roles_and_prompts():
    out = ex3_structure.main(["--iterations", "4"])
    assert [m["llm_0"]["role"] for m in out["cory-no-re"]] == ["pioneer"] * 4
    assert [m["llm_0"]["role"] for m in out["cory"]] == ["pioneer"] * 3 + ["observer"]
    for history in out.values():  # the policies start as the reference, then move away
        assert history[0]["llm_1"]["kl"] == pytest.approx(0.0, abs=1e-6)
        assert history[-1]["llm_1"]["kl"] > 1e-4


def test_ex4_new_task_follows_the_api_and_pays_as_documented():
    assert ex4_task.main() == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(cory_env.env(task="echo"), num_cycles=100)
    task = cory_env.make_task("echo")
    q = task.queries()[:1] * 3
    assert task.reward(q, [q[0].text, q[0].answer, "a"]).tolist() == [1.0, 0.5, 0.0]
