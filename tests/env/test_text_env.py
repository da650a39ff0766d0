"""The text view of the env: PettingZoo's tests, and the token env's rewards step for step."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from pettingzoo.test import api_test, parallel_api_test, seed_test

import cory_env
from cory_env.demo import evaluate
from cory_env.seats import load_policy
from cory_env.text import Prompt

SETTINGS = [dict(task="course"), dict(task="course", n_agents=3, rotation=1),
            dict(task="course", n_agents=1), dict(task="arithmetic"),
            dict(task="sentiment", reward_mode="individual", rotation=1)]


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_pettingzoo_api_seed_and_parallel_tests_pass(kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(cory_env.text_env(**kw), num_cycles=30)
        seed_test(lambda: cory_env.text_env(**kw), num_cycles=30)
        parallel_api_test(cory_env.text_parallel_env(**kw), num_cycles=30)


def word_tokens(tokenizer) -> np.ndarray:
    """Word tokens whose pairs decode and encode back to themselves (a model's text does)."""
    keep = []
    for t in range(len(tokenizer)):
        if t != tokenizer.eos_token_id and tokenizer.decode([t]).strip().isalpha() and \
                tokenizer.encode(tokenizer.decode([t, t]), add_special_tokens=False) == [t, t]:
            keep.append(t)
    return np.array(keep)


def play_tokens(game, rng, words, eos):
    """One episode of the token env with a policy writing word tokens (and sometimes EOS);
    per turn and dead step: (agent, observed prompt text, cumulative reward, done, answer)."""
    env = game.unwrapped
    log = []
    for agent in game.agent_iter():
        _, reward, term, trunc, info = game.last()
        if term or trunc:
            log.append((agent, None, reward, True, info["response"], info["task_reward"]))
            game.step(None)
            continue
        if not len(env.answer_ids(agent)):  # the turn's first token: the prompt is complete
            prompt = env.tokenizer.decode(env.prompt_ids(agent).tolist())
            log.append((agent, prompt, reward, False, None, None))
        game.step(int(eos if rng.random() < 0.1 else rng.choice(words)))
    return log


def play_text(game, answers):
    """The text env fed each agent's answer from `answers`, logged like `play_tokens`."""
    log = []
    for agent in game.agent_iter():
        prompt, reward, term, trunc, info = game.last()
        if term or trunc:
            log.append((agent, None, reward, True, info["response"], info["task_reward"]))
            game.step(None)
            continue
        log.append((agent, str(prompt), reward, False, None, None))
        game.step(answers[agent])
    return log


@pytest.mark.parametrize("kw", SETTINGS[:2] + SETTINGS[3:]
                         + [dict(task="arithmetic", n_agents=3, knowledge_transfer=False)],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_a_token_policys_decoded_answers_earn_the_same_rewards(kw):
    tokens, text = cory_env.env(**kw), cory_env.text_env(**kw)
    tok = tokens.unwrapped.tokenizer
    words, rng = word_tokens(tok), np.random.default_rng(0)
    assert len(words) > 5
    for episode in range(6):
        seed = 100 + episode
        tokens.reset(seed=seed, options={"rotation": episode})
        text.reset(seed=seed, options={"rotation": episode})
        expected = play_tokens(tokens, rng, words, tok.eos_token_id)
        answers = {a: r for a, _, _, done, r, _ in expected if done}
        assert play_text(text, answers) == expected
        assert text.unwrapped.state() == "\n".join(  # every prompt and answer, acting order
            tok.decode(np.concatenate([tokens.unwrapped.prompt_ids(a),
                                       text.unwrapped.answer_tokens(a)]).tolist())
            for a in tokens.unwrapped.order())


def test_answers_are_cut_as_the_token_env_cuts_them():
    game = cory_env.text_env(task="course", max_new_tokens=2)
    game.reset(seed=0)
    game.step("red blue green")  # three words: the first two are kept, no EOS added
    assert game.unwrapped.infos["llm_0"]["response"] == "red blue"
    game.step("white <eos> black")  # EOS ends the answer where it stands
    assert game.unwrapped.infos["llm_1"]["response"] == "white"
    game.reset(seed=0, options={"max_new_tokens": 1})  # a reset's own cap
    game.step("red blue")
    assert game.unwrapped.infos["llm_0"]["response"] == "red"
    game.step("")
    assert game.unwrapped.infos["llm_1"]["response"] == ""


def test_observations_and_spaces():
    game = cory_env.text_env(task="course")
    game.reset(seed=0, options={"queries": [0]})
    query = game.unwrapped.task.queries()[0].text
    prompt = game.observe("llm_0")
    assert isinstance(prompt, Prompt) and prompt == f"colour of {query} ?"
    assert game.observe("llm_1") == ""  # its turn has not begun
    assert game.observation_space("llm_0").contains(prompt)
    game.step("red")
    assert game.observe("llm_1") == f"colour of {query} ? hint : red"
    space = game.action_space("llm_0")
    assert space.contains("red blue") and space.max_length >= 2 * len("yellow")
    with pytest.raises(TypeError, match="answer as a str, got 3"):
        game.step(3)
    with pytest.raises(ValueError, match="action_mask=True"):
        cory_env.text_env(task="course", action_mask=True)


def test_evaluate_reports_each_roles_reward_and_copy_rate():
    from cory_env.tasks.course import THINGS

    def right(prompt):
        return THINGS[prompt.split()[2]]

    def copy(prompt):
        return prompt.split("hint :")[1]

    out = evaluate({"pioneer": right, "observer": copy}, episodes=5, task="course")
    assert out["roles"] == {"pioneer": {"reward": 1.0},
                            "observer": {"reward": 1.0, "copy_rate": 1.0}}
    out = evaluate({"pioneer": right, "observer_1": lambda p: "the"}, episodes=4, task="course",
                   n_agents=3)
    assert out["roles"]["observer_1"] == {"reward": 0.0, "copy_rate": 0.0}
    assert set(out["roles"]["observer_2"]) == {"reward", "copy_rate"}  # no policy: random
    assert len(out["episodes"]) == 4 and set(out["episodes"][0]) == set(out["roles"])
    with pytest.raises(ValueError, match="no role \\['judge'\\]"):
        evaluate({"judge": right}, task="course")
    with pytest.raises(TypeError, match="returned int"):
        evaluate(lambda p: 7, task="course")


def test_load_policy_names_what_is_wrong(tmp_path):
    path = tmp_path / "rules.py"
    path.write_text("def answer(prompt):\n    return 'red'\nvalue = 3\n")
    assert load_policy(f"{path}:answer")("x") == "red"
    with pytest.raises(ValueError, match="no callable 'value'"):
        load_policy(f"{path}:value")
    with pytest.raises(ValueError, match="module:name"):
        load_policy("answer")


def test_an_answer_the_env_alters_is_flagged_in_infos():
    """An out-of-vocabulary answer used to become '' and an over-long one was cut, silently."""
    outcomes = {}
    for answer in ("Crimson!", "red red red red", "red"):
        game = cory_env.text_env(task="course", max_new_tokens=2)
        game.reset(seed=0)
        agent = game.agent_selection
        game.step(answer)
        outcomes[answer] = game.unwrapped.tokens.infos[agent]
    assert outcomes["Crimson!"]["answer_played_as"] == "" and outcomes["Crimson!"][
        "answer_cut_tokens"] == 0
    assert outcomes["red red red red"]["answer_cut_tokens"] == 2
    assert outcomes["red red red red"]["answer_played_as"] is None
    assert outcomes["red"]["answer_cut_tokens"] == 0 and outcomes["red"]["answer_played_as"] is None


def test_text_that_is_not_text_is_refused_naming_the_role():
    game = cory_env.text_env(task="course")
    game.reset(seed=0)
    with pytest.raises(ValueError, match=r"the pioneer's answer .* is not valid text: surrogates"):
        game.step("red \ud800")
    with pytest.raises(ValueError, match="tokenizer must name a tokenizer.*got ''"):
        cory_env.text_env(task="course", tokenizer="")


def test_a_policy_module_registers_its_task_before_the_demo_checks_it(tmp_path, monkeypatch,
                                                                     capsys):
    from cory_env.demo import evaluate, main

    mod = tmp_path / "my_course_policy.py"
    mod.write_text("from cory_env import register_task\n"
                   "from cory_env.tasks.course import CourseTask\n"
                   "@register_task('my-colours-xyz')\n"
                   "class Mine(CourseTask):\n    pass\n"
                   "def copy(prompt):\n    return 'red'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = main(["--tasks", "my-colours-xyz", "--episodes", "1",
                "--policy", "observer=my_course_policy:copy"])
    assert "my-colours-xyz" in out
    result = evaluate({"observer": "my_course_policy:copy"}, episodes=1, task="my-colours-xyz")
    assert result["episodes"][0]["observer"]["answer"] == "red"
    with pytest.raises(SystemExit):
        main(["--tasks", "nowhere-xyz"])
    assert "import it first (command lines: --import MODULE" in capsys.readouterr().err


def test_a_policy_that_raises_says_which_role_it_played():
    from cory_env.demo import evaluate

    def broken(prompt):
        raise ZeroDivisionError("boom")

    with pytest.raises(RuntimeError, match="the observer's policy raised ZeroDivisionError: boom"):
        evaluate({"observer": broken}, episodes=1, task="course")
