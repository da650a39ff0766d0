"""Tasks from the field's environment libraries through the adapter: TextArena's single-turn
games and reasoning-gym's datasets, with their own scorers, splits and the Reference prompt."""

from __future__ import annotations

import re
import warnings

import pytest
from pettingzoo.test import api_test

import cory_env
from cory_env.tasks.library import LibraryTask


def ball_position(question: str) -> int:
    """Follow the ball through the shuffles the question lists (the test's own solver)."""
    start = re.search(r"Ball starts: (.*)", question).group(1).split()
    ball = start.index("[X]")
    for i, j in re.findall(r"swapped cups (\d+) and (\d+)", question):
        i, j = int(i), int(j)
        ball = j if ball == i else i if ball == j else ball
    return ball


def test_textarena_games_are_problems_scored_by_the_game():
    task = cory_env.make_task("textarena", n_queries=200)
    assert isinstance(task, LibraryTask) and task.exact_match
    train, test = task.queries("train"), task.queries("test")
    assert not {q.text for q in train} & {q.text for q in test}
    assert 0.1 < len(test) / (len(train) + len(test)) < 0.3  # one question in 5 held out
    qs = train[:6]
    right = [f"[{ball_position(q.text)}]" for q in qs]
    wrong = [f"[{(ball_position(q.text) + 1) % 3}]" for q in qs]
    assert task.reward(qs, right).tolist() == [1.0] * 6
    assert task.reward(qs, [f" {a}\nbecause I followed it" for a in right]).tolist() == [1.0] * 6
    assert task.reward(qs, wrong).tolist() == [0.0] * 6
    assert task.reward(qs[:3], ["", "cup 0", "[7]"]).tolist() == [0.0] * 3  # invalid moves
    again = cory_env.make_task("textarena", n_queries=200).queries("train")
    assert [q.text for q in again] == [q.text for q in train]  # seeded


def test_the_observer_sees_the_pioneers_move_as_a_reference():
    game = cory_env.text_env(task=cory_env.make_task("textarena", n_queries=50))
    game.reset(seed=0)
    pioneer = game.observe("llm_0")
    assert pioneer.startswith("Question: Track the hidden ball") and pioneer.endswith("Answer:")
    right = f"[{ball_position(pioneer)}]"
    game.step(right)
    observer = game.observe("llm_1")
    assert observer.endswith(f"Reference: {right}\nAnswer:")
    game.step(right)
    assert [game.unwrapped.infos[a]["task_reward"] for a in ("llm_0", "llm_1")] == [1.0, 1.0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(cory_env.env(task=cory_env.make_task("textarena", n_queries=50)),
                 num_cycles=20)


def test_games_that_cannot_be_one_turn_tasks_are_refused_by_name():
    with pytest.raises(ValueError, match="'Sudoku-v0-raw' is not a single-turn game"):
        cory_env.make_task("textarena", game="Sudoku-v0-raw")
    with pytest.raises(ValueError, match="unknown game 'Nope-v0'"):
        cory_env.make_task("textarena", game="Nope-v0")
    with pytest.raises(ValueError, match="n_queries"):
        cory_env.make_task("textarena", n_queries=0)


def test_reasoning_gym_goes_through_the_same_adapter():
    task = cory_env.make_task("reasoning", n_queries=40)
    assert isinstance(task, LibraryTask)
    q = task.queries("train")[0]
    assert task.pioneer_template.startswith("Question: ") and "Answer: " in task.pioneer_template
    assert task.reward([q, q, q], [q.answer, f"{q.answer}\nmore", "no"]).tolist() == [1, 1, 0]
