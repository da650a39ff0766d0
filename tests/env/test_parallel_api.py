"""The parallel API (`turn_based_aec_to_parallel`) on the course task, and its turn semantics."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

import cory_env
from cory_env.tasks.course import WORDS

ID = {w: i for i, w in enumerate(WORDS)}
EOS = ID["<eos>"]


@pytest.mark.parametrize("kw", [{}, {"rotation": 1, "action_mask": True},
                                {"knowledge_transfer": False}])
def test_course_parallel_api_and_seed(kw):
    def make(render_mode=None):
        return cory_env.parallel_env(task="course", render_mode=render_mode, **kw)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(make(), num_cycles=200)
        parallel_seed_test(make, num_cycles=200)


def _first_episode(observer_noise: int):
    """Play 'colour of snow ?' with the pioneer saying 'white <eos>' and the observer 'white'.

    While the pioneer acts, the observer is sent `observer_noise` (which must be ignored).
    Returns every step's (observations, rewards, terminations, infos). Infos are copied on
    receipt: the wrapper hands out the env's own info dicts, which later steps update in place.
    """
    env = cory_env.parallel_env(task="course")
    snow = [q.text for q in env.unwrapped.task.queries()].index("snow")
    obs, infos = env.reset(seed=0, options={"queries": [snow]})
    steps = [(obs, {}, {}, _copy(infos))]
    for pioneer, observer in [(ID["white"], observer_noise), (EOS, observer_noise),
                              (observer_noise, ID["white"]), (observer_noise, EOS)]:
        obs, rewards, terms, _, infos = env.step({"llm_0": pioneer, "llm_1": observer})
        steps.append((obs, rewards, terms, _copy(infos)))
    return env, steps


def _copy(infos: dict) -> dict:
    return {agent: dict(info) for agent, info in infos.items()}


def test_non_acting_agent_is_ignored_padded_and_named_in_infos():
    env, steps = _first_episode(observer_noise=ID["red"])
    _, other = _first_episode(observer_noise=ID["grey"])

    # before its turn the observer sees only padding, with attention mask 0
    first_obs = steps[0][0]["llm_1"]["observation"]
    assert (first_obs["attention_mask"] == 0).all() and (first_obs["input_ids"] == EOS).all()
    assert steps[1][0]["llm_1"]["observation"]["attention_mask"].sum() == 0

    # "active_agent" names the agent whose action the NEXT step applies
    assert steps[1][3]["llm_1"]["active_agent"] == "llm_0"  # pioneer's turn goes on
    assert steps[2][3]["llm_0"]["active_agent"] == "llm_1"  # pioneer said EOS: observer next
    assert steps[3][3]["llm_0"]["active_agent"] == "llm_1"

    # the observer's prompt now holds the pioneer's answer; its own ignored actions left no trace
    observer_prompt = steps[2][0]["llm_1"]["observation"]
    shown = observer_prompt["input_ids"][observer_prompt["attention_mask"] == 1]
    assert [WORDS[i] for i in shown] == "colour of snow ? hint : white".split()

    # the non-acting agent's action is ignored: other observer noise, identical episode
    for (obs_a, rew_a, term_a, _), (obs_b, rew_b, term_b, _) in zip(steps, other):
        assert rew_a == rew_b and term_a == term_b
        for agent in obs_a:
            for key in ("input_ids", "attention_mask"):
                np.testing.assert_array_equal(obs_a[agent]["observation"][key],
                                              obs_b[agent]["observation"][key])

    # the episode ends after the observer's EOS; both get r_pio + r_obs = 1 + 1
    _, rewards, terms, infos = steps[-1]
    assert rewards == {"llm_0": 2.0, "llm_1": 2.0}
    assert all(terms.values())
    assert infos["llm_0"]["task_reward"] == infos["llm_1"]["task_reward"] == 1.0
    assert env.agents == []


def test_course_rewards_the_first_word():
    env = cory_env.env(task="course")
    task = env.unwrapped.task
    snow = next(q for q in task.queries() if q.text == "snow")
    assert task.reward([snow] * 4, ["white", "white red", "red white", ""]).tolist() == [
        1.0, 1.0, 0.0, 0.0]
    assert len(env.unwrapped.tokenizer) == 24


def test_a_step_without_the_acting_agents_action_names_it():
    env = cory_env.parallel_env(task="course")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"'llm_0' acts now .* hold \['llm_1'\]"):
        env.step({"llm_1": 1})
    env.step({"llm_0": 1, "llm_1": 5})  # the acting agent's is applied, the other's ignored
