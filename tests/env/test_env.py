"""Behaviour of the CORY AEC env: PettingZoo conformance, roles, knowledge transfer, rewards."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import ToyTask, toy_tokenizer
from pettingzoo.test import (
    api_test,
    parallel_api_test,
    parallel_seed_test,
    render_test,
    seed_test,
)

import cory_env

TOK = toy_tokenizer()
ID = {w: TOK.convert_tokens_to_ids(w) for w in ["good", "bad", "great", "awful", "movie", "plot"]}
EOS = TOK.eos_token_id


def play(env, script):
    """Run one episode where each agent writes its scripted tokens (EOS appended by the script)."""
    pos = {a: 0 for a in env.possible_agents}
    order, obs = [], {}
    for agent in env.agent_iter():
        ob, reward, term, trunc, info = env.last()
        if term or trunc:
            env.step(None)
            continue
        obs.setdefault(agent, []).append(ob)
        order.append(agent)
        token = script[agent][pos[agent]]
        pos[agent] += 1
        env.step(token)
    return order, obs


def finish(env):
    """Rewards and infos at the moment both agents terminate."""
    return dict(env._cumulative_rewards), {a: dict(i) for a, i in env.infos.items()}


def play_until_end(env, script):
    """Play scripted tokens until both agents terminate; return (rewards, infos)."""
    pos = {a: 0 for a in env.possible_agents}
    while not all(env.terminations.values()):
        agent = env.agent_selection
        env.step(script[agent][pos[agent]])
        pos[agent] += 1
    return finish(env)


def toy_factory(**kw):
    def make(render_mode=None):
        return cory_env.env(task=ToyTask(), render_mode=render_mode, **kw)

    return make


@pytest.mark.parametrize("kw", [{}, {"rotation": 1, "action_mask": True},
                                {"n_agents": 1}, {"knowledge_transfer": False}])
def test_pettingzoo_api_and_seed(kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(toy_factory(**kw)(), num_cycles=300)
        seed_test(toy_factory(**kw))
        render_test(toy_factory(**kw))


def test_pettingzoo_parallel_api_and_seed():
    def make(render_mode=None):
        return cory_env.parallel_env(task=ToyTask(), render_mode=render_mode)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(make(), num_cycles=300)
        parallel_seed_test(make)


def test_parallel_env_marks_the_acting_agent():
    env = cory_env.parallel_env(task=ToyTask(), max_new_tokens=2)
    obs, infos = env.reset(seed=0, options={"queries": [0]})
    assert set(obs) == {"llm_0", "llm_1"}
    _, rewards, terms, _, infos = env.step({"llm_0": ID["good"], "llm_1": ID["bad"]})
    assert infos["llm_0"]["active_agent"] == "llm_0"  # llm_1's action was ignored
    env.step({"llm_0": EOS, "llm_1": 0})
    _, _, _, _, infos = env.step({"llm_0": 0, "llm_1": ID["great"]})
    assert infos["llm_1"]["active_agent"] == "llm_1"


def test_pioneer_then_observer_and_collective_reward():
    env = cory_env.env(task=ToyTask(), max_new_tokens=4)
    env.reset(seed=0, options={"queries": [0]})
    script = {"llm_0": [ID["good"], ID["great"], EOS], "llm_1": [ID["bad"], EOS]}
    order, _ = play(env, script)
    assert order == ["llm_0"] * 3 + ["llm_1"] * 2
    env.reset(seed=0, options={"queries": [0]})
    rewards, infos = play_until_end(env, script)
    assert infos["llm_0"]["task_reward"] == 2.0 and infos["llm_1"]["task_reward"] == -1.0
    assert rewards == {"llm_0": 1.0, "llm_1": 1.0}
    assert infos["llm_0"]["role"] == "pioneer" and infos["llm_1"]["role"] == "observer"
    assert infos["llm_0"]["response"] == "good great"
    assert infos["llm_1"]["response"] == "bad"


def test_individual_reward_mode():
    env = cory_env.env(task=ToyTask(), reward_mode="individual")
    env.reset(options={"queries": [0]})
    rewards, _ = play_until_end(env, {"llm_0": [ID["good"], EOS], "llm_1": [ID["awful"], EOS]})
    assert rewards == {"llm_0": 1.0, "llm_1": -1.0}


def test_last_and_cumulative_rewards_agree():
    env = cory_env.env(task=ToyTask())
    env.reset(options={"queries": [1]})
    script = {"llm_0": [ID["good"], EOS], "llm_1": [ID["good"], EOS]}
    pos = {"llm_0": 0, "llm_1": 0}
    for agent in env.agent_iter():
        _, reward, term, trunc, _ = env.last()
        assert reward == env.unwrapped._cumulative_rewards[agent]
        if term:
            assert reward == 2.0
            env.step(None)
            continue
        env.step(script[agent][pos[agent]])
        pos[agent] += 1


@pytest.mark.parametrize("mode", ["collective", "individual"])
def test_rotation_changes_who_acts_first(mode):
    script = {"llm_0": [ID["good"], EOS], "llm_1": [ID["bad"], ID["bad"], EOS]}
    for rotation, first in [(0, "llm_0"), (1, "llm_1")]:
        env = cory_env.env(task=ToyTask(), reward_mode=mode)
        env.reset(options={"queries": [0], "rotation": rotation})
        assert env.agent_selection == first
        rewards, infos = play_until_end(env, script)
        assert infos[first]["role"] == "pioneer"
        if mode == "individual":
            assert rewards == {"llm_0": 1.0, "llm_1": -2.0}  # rewards follow the agent
        else:
            assert rewards == {"llm_0": -1.0, "llm_1": -1.0}
    # the constructor keyword does the same as the reset option
    env = cory_env.env(task=ToyTask(), rotation=1)
    env.reset()
    assert env.agent_selection == "llm_1"


def test_knowledge_transfer_changes_exactly_the_observer_observation():
    script = {"llm_0": [ID["good"], ID["movie"], EOS], "llm_1": [ID["plot"], EOS]}
    seen = {}
    for kt in (True, False):
        env = cory_env.env(task=ToyTask(), knowledge_transfer=kt)
        env.reset(options={"queries": [2]})
        _, obs = play(env, script)
        seen[kt] = obs
    for a, b in zip(seen[True]["llm_0"], seen[False]["llm_0"]):
        np.testing.assert_array_equal(a["observation"]["input_ids"], b["observation"]["input_ids"])
    kt_ids = seen[True]["llm_1"][0]["observation"]
    no_ids = seen[False]["llm_1"][0]["observation"]
    assert not np.array_equal(kt_ids["input_ids"], no_ids["input_ids"])
    kt_text = TOK.decode(kt_ids["input_ids"][kt_ids["attention_mask"] == 1])
    no_text = TOK.decode(no_ids["input_ids"][no_ids["attention_mask"] == 1])
    assert kt_text == 'I can make this sentence " I liked good movie " more positive : I liked'
    assert no_text == "I liked"


def test_observer_prompt_holds_pioneer_tokens_exactly_as_generated():
    env = cory_env.env(task=ToyTask(), max_new_tokens=5)
    env.reset(options={"queries": [0]})
    # tokens whose decode/re-encode would not round-trip as one unit don't matter here: the
    # observer must see these exact ids, contiguous, in its prompt
    tokens = [ID["movie"], ID["movie"], ID["plot"], ID["great"]]
    for t in tokens + [EOS]:
        env.step(t)
    ob = env.observe("llm_1")["observation"]["input_ids"].tolist()
    assert any(ob[i:i + 4] == tokens for i in range(len(ob)))


def test_one_agent_alone_is_n_agents_1():
    env = cory_env.env(task=ToyTask(), n_agents=1)
    env.reset(options={"queries": [0]})
    assert env.possible_agents == ["llm_0"] and env.agents == ["llm_0"]
    rewards, infos = play_until_end(env, {"llm_0": [ID["great"], ID["good"], EOS]})
    assert rewards == {"llm_0": 2.0} and infos["llm_0"]["task_reward"] == 2.0


def test_max_new_tokens_ends_a_turn():
    env = cory_env.env(task=ToyTask(), max_new_tokens=3)
    env.reset(options={"queries": [0]})
    for _ in range(3):
        assert env.agent_selection == "llm_0"
        env.step(ID["good"])
    assert env.agent_selection == "llm_1"
    assert env.infos["llm_0"]["response"] == "good good good"


def test_render_ansi_returns_transcript_and_human_prints(capsys):
    env = cory_env.env(task=ToyTask(), render_mode="ansi")
    env.reset(options={"queries": [0]})
    play_until_end(env, {"llm_0": [ID["good"], EOS], "llm_1": [ID["bad"], EOS]})
    text = env.render()
    assert "the movie was" in text and "pioneer" in text and "observer" in text
    env = cory_env.env(task=ToyTask(), render_mode="human")
    env.reset(options={"queries": [0]})
    assert env.render() is None and "the movie was" in capsys.readouterr().out


# -- bad input -------------------------------------------------------------------------------

def snapshot(env):
    return (env.agent_selection, env.observe("llm_0"), env.observe("llm_1"),
            dict(env.unwrapped._cumulative_rewards))


def assert_same(a, b):
    assert a[0] == b[0] and a[3] == b[3]
    for x, y in zip(a[1:3], b[1:3]):
        for k in ("input_ids", "attention_mask"):
            np.testing.assert_array_equal(x["observation"][k], y["observation"][k])


def test_out_of_range_token_raises_and_leaves_state_unchanged():
    env = cory_env.env(task=ToyTask())
    env.reset(options={"queries": [0]})
    env.step(ID["good"])
    before = snapshot(env)
    vocab = len(TOK)
    for bad in (vocab, -1, 10**9):
        with pytest.raises(ValueError, match=rf"token {bad}.*vocabulary size {vocab}"):
            env.step(bad)
        assert_same(before, snapshot(env))
    env.step(EOS)  # still usable
    assert env.agent_selection == "llm_1"


@pytest.mark.parametrize("bad", [1.5, "good", None, [1], True, np.float32(2.0)])
def test_non_integer_action_raises_type_error(bad):
    env = cory_env.env(task=ToyTask())
    env.reset(options={"queries": [0]})
    before = snapshot(env)
    with pytest.raises(TypeError, match="integer token id"):
        env.step(bad)
    assert_same(before, snapshot(env))


def test_numpy_integer_actions_are_accepted():
    env = cory_env.env(task=ToyTask())
    env.reset(options={"queries": [0]})
    env.step(np.int32(ID["good"]))
    env.step(np.array(EOS))
    assert env.agent_selection == "llm_1"


def test_stepping_a_finished_agent_needs_none():
    env = cory_env.env(task=ToyTask())
    env.reset(options={"queries": [0]})
    play_until_end(env, {"llm_0": [EOS], "llm_1": [EOS]})
    with pytest.raises(ValueError, match="only valid action is None"):
        env.step(1)


def test_reset_option_with_wrong_type_raises():
    env = cory_env.env(task=ToyTask())
    with pytest.raises(ValueError, match="rotation must be an integer, got 'yes'"):
        env.reset(options={"rotation": "yes"})
    with pytest.raises(ValueError, match="query 99"):
        env.reset(options={"queries": [99]})


def test_unknown_reset_options_warn_once_naming_them():
    env = cory_env.env(task=ToyTask())
    with pytest.warns(UserWarning, match="'colour'.*'zz'"):
        env.reset(options={"zz": 1, "colour": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.reset(options={"zz": 1, "colour": 2})  # the same keys again: no second warning


@pytest.mark.parametrize("kw, match", [
    ({"reward_mode": "shared"}, "reward_mode.*'shared'"),
    ({"max_new_tokens": 0}, "max_new_tokens.*0"),
    ({"rotation": "yes"}, "rotation must be an integer.*'yes'"),
    ({"swap_roles": True}, "swap_roles is gone: .*rotation=1 makes llm_1 the pioneer"),
    ({"single_agent": True}, "single_agent is gone: .*n_agents=1"),
    ({"render_mode": "rgb"}, "render_mode.*'rgb'"),
    ({"task": "nope"}, "unknown task 'nope'"),
    ({"colour": 1}, "unknown env config keys.*colour"),
    ({"max_new_tokens": 50, "context_len": 40}, "context_len"),
])
def test_bad_config_names_the_value(kw, match):
    kw.setdefault("task", ToyTask())
    with pytest.raises((ValueError, TypeError), match=match):
        cory_env.env(**kw)


def test_long_prompt_is_left_truncated_and_counted():
    env = cory_env.env(task=ToyTask(), context_len=10, max_new_tokens=4)  # P = 6
    env.reset(options={"queries": [cory_env.Query("the movie was very very good I liked it")]})
    ob = env.observe("llm_0")["observation"]
    assert TOK.decode(ob["input_ids"][:6]) == "very very good I liked it"  # the last 6 tokens
    assert env.infos["llm_0"]["truncated_prompt_tokens"] == 3
    env.step(EOS)
    assert env.infos["llm_1"]["truncated_prompt_tokens"] > 0


@pytest.mark.parametrize("task, match", [
    (ToyTask(fail_on="bad"), r"task 'toy' raised on sample 1"),
    (ToyTask(nan_on="awful"), r"task 'toy' returned nan for sample 1"),
])
def test_reward_errors_name_task_and_sample(task, match):
    env = cory_env.env(task=task)
    env.reset(options={"queries": [0]})
    env.step(ID["good"])
    env.step(EOS)
    env.step(ID["bad"] if task.fail_on else ID["awful"])
    with pytest.raises(RuntimeError, match=match):
        env.step(EOS)
