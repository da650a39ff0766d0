"""Rounds: agents that speak more than once, payments per round, early ends, games."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import ToyTask
from pettingzoo.test import api_test, parallel_api_test, seed_test

import cory_env
from cory_env import BatchedCoryEnv, make_task


class EachRound(ToyTask):
    """The toy task, paying every round."""

    round_rewards = "each"


@pytest.mark.parametrize("k, rounds", [(2, 3), (3, 2), (1, 3)])
def test_pettingzoo_tests_pass_with_rounds(k, rounds):
    api_test(cory_env.env(task="course", n_agents=k, rounds=rounds), num_cycles=60)
    seed_test(lambda: cory_env.env(task="course", n_agents=k, rounds=rounds), num_cycles=60)
    parallel_api_test(cory_env.parallel_env(task="course", n_agents=k, rounds=rounds),
                      num_cycles=60)


def play(env, tokens):
    """Play an AEC episode, agent by agent, with `tokens(agent, step)`; the acting order, the
    prompts each turn started with, and the rewards as they came."""
    order, prompts, paid, steps = [], [], [], {}
    for agent in env.agent_iter():
        obs, reward, term, trunc, _ = env.last()
        paid.append((agent, reward))
        if term or trunc:
            env.step(None)
            continue
        if not env.unwrapped.answer_ids(agent).size or obs["observation"]["attention_mask"][
                env.unwrapped.prompt_len:].sum() == 0:
            order.append(agent)
            prompts.append(env.unwrapped.tokenizer.decode(env.unwrapped.prompt_ids(agent)))
        steps[agent] = steps.get(agent, 0) + 1
        env.step(tokens(agent, steps[agent]))
    return order, prompts, paid


def test_every_agent_speaks_once_a_round_and_sees_the_whole_transcript(toy_task):
    env = cory_env.env(task=toy_task, rounds=3)
    env.reset(seed=0)
    tok = env.unwrapped.tokenizer
    words = {"llm_0": "good", "llm_1": "bad"}
    order, prompts, _ = play(env, lambda a, s: tok.convert_tokens_to_ids(words[a]))
    assert order == ["llm_0", "llm_1"] * 3
    # round 2's pioneer prompt lists both round-1 answers; round 3's observer all five
    assert prompts[2].endswith("good good good good bad bad bad bad \" more positive : " +
                               env.unwrapped.episodes.queries[0].text)
    assert prompts[5].count("good good good good") == 3 and prompts[5].count("bad bad bad bad") == 2
    assert env.unwrapped.episodes.L > toy_task.default_context_len  # fitted to the transcript


def test_rounds_1_is_the_env_of_one_pass(toy_task):
    one, plain = cory_env.env(task=toy_task, rounds=1), cory_env.env(task=ToyTask())
    for env in (one, plain):
        env.reset(seed=3)
    tokens = lambda a, s: 4 + s % 3  # noqa: E731
    assert play(one, tokens) == play(plain, tokens)


def test_a_task_that_pays_every_round_pays_at_each_rounds_end():
    env = cory_env.env(task=EachRound(), rounds=2, reward_mode="individual")
    env.reset(seed=0)
    tok = env.unwrapped.tokenizer
    word = {"llm_0": tok.convert_tokens_to_ids("good"), "llm_1": tok.convert_tokens_to_ids("bad")}
    _, _, paid = play(env, lambda a, s: word[a])
    nonzero = [(a, r) for a, r in paid if r]
    # llm_0 is paid +4 after round 1 (seen at its next turn) and after round 2; llm_1 -4 twice
    assert nonzero == [("llm_0", 4.0), ("llm_1", -4.0), ("llm_0", 4.0), ("llm_1", -4.0)]


@pytest.mark.parametrize("llm_1_stops, expected", [
    (False, {"llm_0": 3, "llm_1": 3}),  # answers of 2 tokens: 2 + 1 steps each, then llm_0 is spent
    (True, {"llm_0": 3, "llm_1": 2}),  # llm_1 answers EOS at once: 1 + 1 steps when llm_0 is spent
])
def test_max_cycles_caps_every_agents_steps_over_the_episode(llm_1_stops, expected):
    env = cory_env.env(task="course", rounds=3, max_cycles=3)
    env.reset(seed=0)
    eos, word = env.unwrapped.tokenizer.eos_token_id, 3
    acted, ends = {}, {}
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            ends[agent] = (term, trunc)
            env.step(None)
            continue
        acted[agent] = acted.get(agent, 0) + 1
        env.step(eos if llm_1_stops and agent == "llm_1" else word)
    assert acted == expected
    assert ends == {"llm_0": (False, True), "llm_1": (False, True)}


def test_the_batched_env_equals_the_aec_env_with_rounds(toy_task):
    batched = BatchedCoryEnv(batch_size=3, task=toy_task, rounds=2, n_agents=3)
    batched.reset(seed=0, options={"queries": [0, 1, 2], "rotation": 1})
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, len(batched.tokenizer), size=(6, 4, 3))
    while not batched.finished:
        turn, t = batched.turn_index, batched.episodes.t
        batched.step(torch.as_tensor(tokens[turn, t]))
    for i in range(3):
        aec = cory_env.env(task=ToyTask(), rounds=2, n_agents=3)
        aec.reset(options={"queries": [i], "rotation": 1})
        steps = {}
        for agent in aec.agent_iter():
            _, _, term, trunc, _ = aec.last()
            if term or trunc:
                aec.step(None)
                continue
            ep = aec.unwrapped.episodes
            aec.step(int(tokens[ep.turn, ep.t, i]))
            steps[agent] = steps.get(agent, 0) + 1
        ep = aec.unwrapped.episodes
        assert np.array_equal(ep.ids[:, 0], batched.episodes.ids[:, i])
        assert np.array_equal(ep.turn_paid[:, 0], batched.episodes.turn_paid[:, i])
    for agent in batched.agents:
        paid, task = batched.turn_rewards(agent)
        assert paid.shape == task.shape == (2, 3)
        assert torch.equal(paid.sum(0), batched.reward(agent))


def test_rounds_are_checked_by_name():
    with pytest.raises(ValueError, match="rounds must be a positive integer, got 0"):
        cory_env.env(task="course", rounds=0)


# -- tasks with rounds ----------------------------------------------------------------------
def move_tokens(env, moves):
    """Token ids of each move then EOS, as a token function for `play`."""
    tok = env.unwrapped.tokenizer
    seqs = [tok.encode(m, add_special_tokens=False) + [tok.eos_token_id] for m in moves]

    def tokens(agent, step):
        ep = env.unwrapped.episodes
        return seqs[ep.turn][ep.t]

    return tokens


def test_a_two_player_game_is_played_move_by_move_and_pays_its_outcome():
    env = cory_env.env(task="game", rounds=5, reward_mode="individual")
    env.reset(seed=0)
    # O takes the top row while X plays elsewhere: player 0 (llm_0) wins on move 5
    order, prompts, paid = play(env, move_tokens(env, ["[0]", "[4]", "[1]", "[8]", "[2]"]))
    assert order == ["llm_0", "llm_1", "llm_0", "llm_1", "llm_0"]  # over early: 5 of 10 turns
    assert prompts[0].startswith("You are Player 0 in Tic Tac Toe")
    assert prompts[2].startswith("You are Player 0") and " 3 | X | 5 " in prompts[2]
    assert dict(paid[-2:]) == {"llm_0": 1.0, "llm_1": -1.0}


def test_an_invalid_move_loses_the_game_at_once_and_sides_follow_the_rotation():
    env = cory_env.env(task="game", rounds=5, reward_mode="individual")
    env.reset(seed=0, options={"rotation": 1})
    order, _, paid = play(env, move_tokens(env, ["no move"]))
    assert order == ["llm_1"]
    assert dict(paid[-2:]) == {"llm_1": -1.0, "llm_0": 1.0}


def test_games_are_zero_sum_and_the_others_are_refused_by_name():
    with pytest.warns(UserWarning, match="zero-sum: .*reward_mode='individual'"):
        cory_env.env(task="game", rounds=2)
    for game in ("Chess-v0-raw", "KuhnPoker-v0-raw", "Nope"):
        with pytest.raises(ValueError, match=f"{game!r} is not a two-player TextArena game"):
            make_task("game", game=game)
    nim = make_task("game", game="Nim-v0-raw", n_queries=20)
    train, test = ({q.text for q in nim.queries(s)} for s in ("train", "test"))
    assert train and test and not train & test


def test_revision_shows_each_agent_the_others_latest_answer():
    task = make_task("revision", base="reviews")
    first, second, third, fourth = task.templates(True, 2, rounds=2)
    assert second.text == task.base.observer_template
    assert third.text == task.base.observer_template.replace("{response}", "{response_2}")
    assert fourth.text == task.base.observer_template.replace("{response}", "{response_3}")
    assert make_task("revision", base="reasoning", per_round=True).round_rewards == "each"
    with pytest.raises(ValueError, match="revision: base task 'game' cannot be revised"):
        make_task("revision", base="game")
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        make_task("revision", base="nope")
    env = cory_env.env(task=make_task("revision", base="sentiment"), rounds=2)
    api_test(env, num_cycles=60)


def test_one_side_can_be_a_rule_and_the_text_env_plays_games_in_words():
    """opponent="first": one model player (n_agents=1), each move answered by the rule."""
    env = cory_env.text_env(task=make_task("game", opponent="first"), n_agents=1, rounds=5)
    for moves, outcome in ((["[8]", "[7]", "[6]"], 1.0), (["[4]", "[4]"], -1.0)):
        env.reset(seed=0)
        answers = iter(moves)
        for _ in env.agent_iter():
            prompt, reward, term, trunc, _ = env.last()
            if term or trunc:
                env.step(None)
                continue
            env.step(next(answers))
        assert reward == outcome and "Player 1 placed their symbol (X)" in prompt
    with pytest.raises(ValueError, match="opponent 'best' is not a rule of"):
        make_task("game", opponent="best")
    with pytest.raises(ValueError, match="1 model player.*n_agents must be 1, got 2"):
        cory_env.env(task=make_task("game", opponent="first"), rounds=2)


def test_a_batch_over_mid_round_gives_every_agent_the_same_rounds():
    """Both games end on llm_0's invalid second move (turn 3 of 10): llm_1's turn of that
    round was never reached, yet it holds its prompt, the outcome as its last round's task
    reward, and the payment sits on the turn in which it last spoke."""
    env = BatchedCoryEnv(batch_size=2, task="game", rounds=5, reward_mode="individual")
    env.reset(seed=0)
    tok = env.tokenizer
    for move in ("[0]", "[4]", "no move"):
        ids = tok.encode(move, add_special_tokens=False) + [tok.eos_token_id]
        for t in ids:
            if env.finished:
                break
            env.step(torch.tensor([t, t]))
    ep = env.episodes
    assert env.finished and ep.turn == 2
    assert ep.finished_turns(0) == [0, 2] and ep.finished_turns(1) == [1, 3]
    assert ep.mask[3].sum() > 0 and ep.resp_len[3].sum() == 0  # a prompt, no answer
    paid, task = env.turn_rewards("llm_1")
    assert paid.tolist() == [[1.0, 1.0], [0.0, 0.0]] and task.tolist() == [[0, 0], [1.0, 1.0]]
    paid, task = env.turn_rewards("llm_0")
    assert paid.tolist() == [[0, 0], [-1.0, -1.0]] and task[-1].tolist() == [-1.0, -1.0]


def test_the_single_turn_textarena_task_points_two_player_games_to_the_game_task():
    for game in ("TicTacToe-v0-raw", "Nim-v0"):
        with pytest.raises(ValueError, match=f"{game!r} is a two-player game: play it over "
                                             f"rounds with task 'game'"):
            make_task("textarena", game=game)
