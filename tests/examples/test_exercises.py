"""Every exercise in docs/exercises.md runs, and its solution behaves as the page says."""

from __future__ import annotations

import warnings

import pytest
import torch
from pettingzoo.test import api_test

import cory_env
from examples.exercises import (
    ex1_text,
    ex2_learner,
    ex3_rewards,
    ex4_structure,
    ex5_task,
    ex6_game,
)


def test_ex1_string_policies_play_a_trained_model():
    out = ex1_text.main(["--iterations", "8", "--episodes", "16"])
    assert out["rule -> copycat"]["pioneer"]["reward"] == 2.0  # the rule is the best answer
    assert out["rule -> copycat"]["observer"] == {"reward": 2.0, "copy_rate": 1.0}
    assert out["untrained -> copycat"]["pioneer"]["reward"] < 1.0
    trained = out["trained -> copycat"]["pioneer"]["reward"]
    assert trained > out["untrained -> copycat"]["pioneer"]["reward"] + 1.0
    assert out["rule -> trained"]["observer"]["reward"] > 1.0
    assert ex1_text.rule("colour of snow ? hint : red") == "white white"
    assert ex1_text.copycat("colour of snow ? hint : red blue") == "red blue"


def test_ex2_own_learner_learns():
    curve = ex2_learner.main(["--iterations", "8"])
    assert sum(curve[-2:]) / 2 > sum(curve[:2]) / 2 + 0.4, curve


def test_ex3_difference_rewards_remove_the_other_agents_noise():
    own = torch.tensor([1.0, 0.0, 2.0, 1.0])
    other = torch.tensor([5.0, -3.0, 0.0, 2.0])
    d = ex3_rewards.difference_rewards(own, own + other)
    torch.testing.assert_close(d, own - own.mean())  # no trace of the other agent
    out = ex3_rewards.main(["--iterations", "2"])
    assert set(out) == {"cory", "cory-individual", "ippo-difference"}


def test_ex4_structure_flags_change_roles_and_prompts():
    out = ex4_structure.main(["--iterations", "4"])
    assert [m["llm_0"]["role"] for m in out["cory-no-re"]] == ["pioneer"] * 4
    assert [m["llm_0"]["role"] for m in out["cory"]] == ["pioneer"] * 3 + ["observer"]
    for history in out.values():  # the policies start as the reference, then move away
        assert history[0]["llm_1"]["kl"] == pytest.approx(0.0, abs=1e-6)
        assert history[-1]["llm_1"]["kl"] > 1e-4


def test_ex6_rules_play_a_game_and_a_model_trains_against_one(tmp_path, capsys):
    from helpers import write_tiny_gguf

    out = ex6_game.main(["--games", "2", "--iterations", "2", "--batch", "4", "--model",
                         write_tiny_gguf(tmp_path / "tiny.gguf")])
    assert out["rules"]["first -> first"] == {"llm_0": 1.0, "llm_1": -1.0}
    assert out["rules"]["first -> centre"] == {"llm_0": -1.0, "llm_1": 1.0}
    assert len(out["trained"]) == 2 and all(-1 <= x <= 1 for x in out["trained"])
    assert ex6_game.centre("Available Moves: '[0]', '[4]'") == "[4]"
    printed = capsys.readouterr().out  # a line per iteration, as it comes
    assert "iteration 0: mean outcome" in printed and "iteration 1: mean outcome" in printed


def test_ex5_new_task_follows_the_api_and_pays_as_documented():
    assert ex5_task.main() == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(cory_env.env(task="echo"), num_cycles=100)
    task = cory_env.make_task("echo")
    q = task.queries()[:1] * 3
    assert task.reward(q, [q[0].text, q[0].answer, "a"]).tolist() == [1.0, 0.5, 0.0]


FAST = ["--iterations", "1", "--batch-size", "4", "--mini-batch-size", "4", "--ppo-epochs", "1",
        "--max-new-tokens", "2", "--eval-problems", "0", "--seeds", "0", "--final-window", "1",
        "--no-progress"]


@pytest.mark.slow
def test_the_documented_benchmark_commands_run_as_written(tmp_path):
    """Every `python -m benchmarks.run` / `examples.exercises.common` command of
    docs/exercises.md runs in a fresh folder (shrunk by appended options; on the course LM)."""
    import os
    import re
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "exercises.md").read_text()
    commands = [c for c in re.findall(r"^(python -m [^\n`]+)$|`(python -m [^`]+)`", text, re.M)]
    commands = [a or b for a, b in commands]
    wanted = [c for c in commands if "benchmarks.run" in c or "exercises.common" in c]
    assert len(wanted) >= 4, wanted
    env = {**os.environ, "PYTHONPATH": str(root)}
    lm = tmp_path / "runs" / "course-lm"
    subprocess.run([sys.executable, "-m", "examples.exercises.common", str(lm)], cwd=tmp_path,
                   env=env, check=True, capture_output=True)
    for k, command in enumerate(wanted):
        argv = shlex.split(command)[1:]
        if "benchmarks.run" in command:
            argv += FAST + ["--out", str(tmp_path / f"run{k}")]
            if "--model" not in argv:
                argv += ["--import", "examples.exercises.common", "--tasks", "colours",
                         "--model", str(lm)]
        p = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, (command, p.stderr[-2000:])


def test_a_text_policy_answers_within_the_env_cap_and_the_models_positions(tmp_path):
    """docs/exercises.md's `text_policy(policy, tokenizer)` decoded 32 tokens into a 32-position
    LM and crashed inside torch; it now takes the env's turn cap, and a cap past the model's
    positions is refused by name before decoding."""
    from agents.llm.text import text_policy
    from agents.training.train import Trainer
    from cory_env.demo import evaluate
    from examples.exercises.common import course_config, course_lm

    trainer = Trainer(course_config("cory", course_lm(str(tmp_path)), 1))
    policy = text_policy(trainer.learner.policies["llm_0"], trainer.env.tokenizer)
    result = evaluate({"pioneer": policy}, episodes=2, task="colours")
    assert len(result["episodes"]) == 2 and policy.turn_cap == trainer.env.max_new_tokens
    assert isinstance(policy("colour of snow ?"), str)
    too_long = text_policy(trainer.learner.policies["llm_0"], trainer.env.tokenizer,
                           max_new_tokens=40)
    with pytest.raises(ValueError, match=r"plus max_new_tokens=40 needs \d+ positions, but the "
                                         r"model has 32"):
        too_long("colour of snow ?")


def test_ex6_refuses_a_bad_value_before_any_game(capsys):
    for argv, said in ((["--iterations", "-1"], "--iterations must be a positive integer"),
                       (["--batch", "0"], "--batch must be a positive integer"),
                       (["--games", "0"], "--games must be a positive integer")):
        with pytest.raises(SystemExit):
            ex6_game.main(argv)
        out, err = capsys.readouterr()
        assert said in err and "player 0" not in out and "Traceback" not in err, (out, err)
