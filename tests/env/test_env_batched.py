"""The batched lockstep env equals the AEC env, step for step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import ToyTask, toy_tokenizer

import cory_env
from cory_env import BatchedCoryEnv

TOK = toy_tokenizer()
EOS = TOK.eos_token_id


def random_scripts(rng, batch, max_new, vocab, eos_prob=0.25):
    """Per-episode token scripts with early EOS in some episodes."""
    tokens = rng.integers(1, vocab, size=(2, batch, max_new))
    tokens[rng.random(tokens.shape) < eos_prob] = EOS
    return tokens


@pytest.mark.parametrize("kw", [{}, {"rotation": 1}, {"knowledge_transfer": False},
                                {"reward_mode": "individual"}, {"n_agents": 1}])
def test_batched_equals_aec(kw):
    batch, max_new = 7, 5
    rng = np.random.default_rng(0)
    queries = [int(i) for i in rng.integers(0, len(ToyTask.PROMPTS), batch)]
    scripts = random_scripts(rng, batch, max_new, len(TOK))
    benv = BatchedCoryEnv(batch_size=batch, task=ToyTask(), max_new_tokens=max_new, **kw)
    obs = benv.reset(options={"queries": queries})
    b_obs = {a: [[] for _ in range(batch)] for a in benv.possible_agents}
    turn = 0
    while not benv.finished:
        agent = benv.agent_selection
        t = obs["step"]
        for i in np.flatnonzero(obs["active"].numpy()):
            b_obs[agent][i].append((obs["input_ids"][i].numpy(), obs["attention_mask"][i].numpy()))
        turn = 0 if benv.role == "pioneer" else 1
        actions = torch.as_tensor(scripts[turn, :, t])
        obs, rewards, terms, truncs, infos = benv.step(actions)
    assert all(bool(terms[a].all()) for a in benv.agents)

    for i in range(batch):
        env = cory_env.env(task=ToyTask(), max_new_tokens=max_new, **kw)
        env.reset(options={"queries": [queries[i]]})
        seen = {a: [] for a in env.possible_agents}
        pos = [0, 0]
        while not all(env.terminations.values()):
            agent = env.agent_selection
            ob = env.observe(agent)["observation"]
            seen[agent].append((ob["input_ids"], ob["attention_mask"]))
            turn = 0 if env.infos[agent]["role"] == "pioneer" else 1
            env.step(int(scripts[turn, i, pos[turn]]))
            pos[turn] += 1
        for agent in env.agents:
            assert len(seen[agent]) == len(b_obs[agent][i])
            for (ia, ma), (ib, mb) in zip(seen[agent], b_obs[agent][i]):
                np.testing.assert_array_equal(ia, ib)
                np.testing.assert_array_equal(ma, mb)
            assert env.rewards[agent] == pytest.approx(float(rewards[agent][i]))
            assert env.infos[agent]["task_reward"] == pytest.approx(
                float(infos[agent]["task_reward"][i]))
            assert env.infos[agent]["response"] == infos[agent]["response"][i]
            assert env.infos[agent]["role"] == infos[agent]["role"]


def test_each_episode_handles_its_own_eos():
    benv = BatchedCoryEnv(batch_size=3, task=ToyTask(), max_new_tokens=4)
    benv.reset(options={"queries": [0, 1, 2]})
    good = TOK.convert_tokens_to_ids("good")
    obs, *_ = benv.step(torch.tensor([EOS, good, good]))
    assert obs["active"].tolist() == [False, True, True]
    obs, *_ = benv.step(torch.tensor([good, EOS, good]))  # row 0's token is ignored
    assert obs["active"].tolist() == [False, False, True]
    turn = benv.episodes
    assert turn.resp_len[0].tolist() == [1, 2, 2]
    obs, *_ = benv.step(torch.tensor([good, good, EOS]))  # all done -> observer's turn
    assert benv.role == "observer" and obs["step"] == 0 and obs["active"].all()
    pio = benv.turn_batch(benv.agents[0])
    assert pio["response_mask"].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]]


def test_batched_bad_actions():
    benv = BatchedCoryEnv(batch_size=2, task=ToyTask())
    benv.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        benv.step(torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="integer"):
        benv.step(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=f"token 999 .*vocabulary size {len(TOK)}"):
        benv.step(torch.tensor([1, 999]))
    assert benv.episodes.t == 0  # nothing was written


def test_batched_reset_is_seeded():
    a = BatchedCoryEnv(batch_size=16, task=ToyTask(), seed=3)
    b = BatchedCoryEnv(batch_size=16, task=ToyTask())
    assert torch.equal(a.reset()["input_ids"], b.reset(seed=3)["input_ids"])


def test_batched_state_is_joint_transcript():
    benv = BatchedCoryEnv(batch_size=2, task=ToyTask(), max_new_tokens=2)
    benv.reset(options={"queries": [0, 1]})
    while not benv.finished:
        benv.step(torch.tensor([TOK.convert_tokens_to_ids("good")] * 2))
    state = benv.state()
    L = benv.episodes.L
    assert state["input_ids"].shape == (2, 2 * L)
    assert torch.equal(state["input_ids"][:, :L], benv.turn_batch("llm_0")["input_ids"])
    assert torch.equal(state["input_ids"][:, L:], benv.turn_batch("llm_1")["input_ids"])
