"""K-agent chains: order and rotation, templates of earlier answers, rewards, context length,
PettingZoo's tests for K = 3 and 4, and the batched env equal to the AEC env step for step."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from helpers import ToyTask
from pettingzoo.test import api_test, parallel_api_test, seed_test

import cory_env
from cory_env import BatchedCoryEnv, make_task


@pytest.mark.parametrize("k", [3, 4])
def test_pettingzoo_tests_pass_for_k_agents(k):
    api_test(cory_env.env(task="course", n_agents=k), num_cycles=40)
    seed_test(lambda: cory_env.env(task="course", n_agents=k), num_cycles=40)
    parallel_api_test(cory_env.parallel_env(task="course", n_agents=k), num_cycles=40)


def test_rotation_orders_the_chain():
    env = cory_env.env(task="course", n_agents=4)
    for r, first in [(0, "llm_0"), (1, "llm_1"), (3, "llm_3"), (5, "llm_1"), (-1, "llm_3")]:
        env.reset(seed=0, options={"rotation": r})
        names = [f"llm_{(k + r) % 4}" for k in range(4)]
        assert env.agents == names and env.agent_selection == first
        roles = [env.unwrapped.infos[a]["role"] for a in names]
        assert roles == ["pioneer", "observer_1", "observer_2", "observer_3"]
    assert cory_env.env(task="course", n_agents=3, rotation=2).unwrapped.possible_agents == \
        ["llm_0", "llm_1", "llm_2"]


def test_role_order_is_one_option_and_the_old_spellings_are_refused_by_name():
    a = cory_env.env(task="course")
    a.reset(seed=1, options={"rotation": 1})
    assert a.agents == ["llm_1", "llm_0"]
    with pytest.raises(TypeError, match="swap_roles is gone: .*rotation=1"):
        cory_env.env(task="course", swap_roles=True)
    env = BatchedCoryEnv(batch_size=2, task="course", n_agents=3)
    for gone in ({"swap_roles": True}, {"order": ["llm_2", "llm_0", "llm_1"]}):
        with pytest.raises(ValueError, match=f"reset option '{next(iter(gone))}' is gone: "
                                             f".*rotation"):
            env.reset(options=gone)
    env = cory_env.env(task="course", n_agents=3)
    with pytest.raises(ValueError, match="rotation must be an integer, got 1.5"):
        env.reset(options={"rotation": 1.5})
    with pytest.raises(ValueError, match="n_agents must be a positive integer, got 0"):
        cory_env.env(task="course", n_agents=0)


def play(env, tokens_by_position):
    """Play an AEC episode with fixed tokens per position; return (prompts, rewards, infos)."""
    prompts, pos, end = {}, {}, None
    for agent in env.agent_iter():
        obs, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        k = pos.setdefault(agent, len(pos))
        if agent not in prompts:
            ids = obs["observation"]["input_ids"]
            mask = obs["observation"]["attention_mask"].astype(bool)
            P = env.unwrapped.episodes.P
            prompts[agent] = env.unwrapped.tokenizer.decode(ids[:P][mask[:P]].tolist())
            prompts[agent + "_t"] = 0
        t = prompts[agent + "_t"]
        prompts[agent + "_t"] += 1
        env.step(tokens_by_position[k][t])
        if env.unwrapped.episodes.finished and end is None:
            end = dict(env.rewards), {a: dict(i) for a, i in env.infos.items()}
    return prompts, *end


def test_each_position_sees_every_earlier_answer_and_rewards_sum_over_k():
    tok = make_task("course").tokenizer
    ids = [tok.encode(w, add_special_tokens=False)[0] for w in ("red", "white", "a", "white")]
    eos = tok.eos_token_id
    env = cory_env.env(task="course", n_agents=3)
    env.reset(options={"queries": [4], "rotation": 1})  # query 4: snow -> white
    prompts, rewards, infos = play(env, [[ids[0], ids[2]], [ids[1], eos], [ids[3], eos]])
    assert prompts["llm_1"] == "colour of snow ?"
    assert prompts["llm_2"] == "colour of snow ? hint : red a"
    assert prompts["llm_0"] == "colour of snow ? hint : red a hint : white"  # EOS not copied
    assert [infos[a]["task_reward"] for a in ("llm_1", "llm_2", "llm_0")] == [0.0, 1.0, 1.0]
    assert rewards == {"llm_0": 2.0, "llm_1": 2.0, "llm_2": 2.0}
    env = cory_env.env(task="course", n_agents=3, reward_mode="individual")
    env.reset(options={"queries": [4]})
    _, rewards, _ = play(env, [[ids[0], ids[2]], [ids[1], eos], [ids[3], eos]])
    assert rewards == {"llm_0": 0.0, "llm_1": 1.0, "llm_2": 1.0}


def test_without_knowledge_transfer_every_position_sees_only_the_query():
    env = cory_env.env(task="course", n_agents=3, knowledge_transfer=False)
    env.reset(options={"queries": [0]})
    tok = env.unwrapped.tokenizer
    red = tok.encode("red", add_special_tokens=False)[0]
    prompts, _, _ = play(env, [[red, red]] * 3)
    assert {prompts[a] for a in ("llm_0", "llm_1", "llm_2")} == {"colour of blood ?"}


def test_task_chain_templates():
    arith = make_task("arithmetic", n_queries=4)
    t = arith.templates(True, 4)
    assert t[1].text.endswith("Question: {query}\nReference: {response}\nAnswer:")
    assert t[3].text.endswith("Question: {query}\nReference 1: {response_1}\n"
                              "Reference 2: {response_2}\nReference 3: {response_3}\nAnswer:")
    senti = make_task("sentiment", n_queries=4).templates(True, 3)
    assert senti[2].text == ('I can make these sentences "{query}{response_1}" '
                             '"{query}{response_2}" more positive: {query}')
    assert make_task("gsm8k").chain_template(2).endswith("Reference 2: {response_2}\nAnswer:")
    assert make_task("imdb").chain_template(2) == senti[2].text
    toy = ToyTask().templates(True, 3)  # a task without its own: answers listed by line
    assert toy[2].text == 'I can make this sentence " {query} {response_1}\n{response_2} " ' \
                          'more positive : {query}'
    assert ToyTask().templates(True) == ToyTask().templates(True, 2)
    assert len(ToyTask().templates(True)) == 2


def test_a_template_that_names_a_later_answer_is_refused():
    class Ahead(ToyTask):
        def chain_template(self, position):
            return f"{{query}} {{response_{position + 1}}}"

    cory_env.register_task("toy-ahead", Ahead)
    with pytest.raises(ValueError, match=r"uses \{response_3\}, but only answers 1..2"):
        cory_env.env(task="toy-ahead", n_agents=3)


def test_context_grows_with_k_or_a_short_one_is_named():
    sizes = [cory_env.env(task="course", n_agents=k).unwrapped.episodes.L for k in (2, 3, 4)]
    assert sizes == [10, 14, 18]  # 4 static + 1 query + k-1 hints of (2 + T) ... + T
    with pytest.warns(UserWarning, match="context_len=10 is too short for its prompts with 3 "
                                         "agent.*raise "
                                         "context_len to 14"):
        cory_env.env(task="course", n_agents=3, context_len=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cory_env.env(task="course", n_agents=3, context_len=14)
    env = cory_env.env(task="course", n_agents=4)
    env.reset()
    for _ in env.agent_iter():
        obs, _, term, trunc, info = env.last()
        assert info["truncated_prompt_tokens"] == 0
        env.step(None if term or trunc else 5)


@pytest.mark.parametrize("k,rotation,mode", [(3, 2, "collective"), (4, 1, "individual")])
def test_batched_env_equals_aec_env_step_for_step(k, rotation, mode):
    B, kw = 5, dict(task="course", n_agents=k, reward_mode=mode)
    batched = BatchedCoryEnv(batch_size=B, **kw)
    obs = batched.reset(seed=3, options={"rotation": rotation})
    tokens = np.random.default_rng(0).integers(0, len(batched.tokenizer),
                                               size=(k, batched.max_new_tokens, B))
    prompts = {}  # each turn's first observation
    while not batched.finished:
        prompts.setdefault(batched.agent_selection, obs["input_ids"].clone())
        obs, *_ = batched.step(torch.as_tensor(tokens[batched.episodes.turn,
                                                      batched.episodes.t]))
    state = batched.state()["input_ids"]
    assert state.shape == (B, k * batched.episodes.L)
    for i in range(B):
        env = cory_env.raw_env(**kw)
        env.reset(options={"queries": [int(batched.query_indices[i])], "rotation": rotation})
        assert env.agents == batched.agents
        seen = set()
        while not env.episodes.finished:
            agent, ep = env.agent_selection, env.episodes
            if agent not in seen:
                seen.add(agent)
                np.testing.assert_array_equal(env.observe(agent)["observation"]["input_ids"],
                                              prompts[agent][i].numpy())
            env.step(int(tokens[ep.turn, ep.t, i]))
        for agent in env.agents:
            assert env.rewards[agent] == pytest.approx(float(batched.reward(agent)[i]))
            assert env.infos[agent]["role"] == batched.infos()[agent]["role"]
        np.testing.assert_array_equal(env.state()["input_ids"], state[i].numpy())
