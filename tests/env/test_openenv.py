"""The text env behind OpenEnv: a real OpenEnv client plays a role over loopback."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("openenv.core")
import uvicorn  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from cory_env.demo import evaluate  # noqa: E402
from cory_env.openenv import CoryAction, CoryOpenEnv, app  # noqa: E402
from cory_env.tasks.course import THINGS  # noqa: E402


def right(prompt: str) -> str:
    return THINGS[prompt.split()[2]]


def copy(prompt: str) -> str:
    return prompt.split("hint :")[1].strip()


@pytest.fixture
def serve():
    servers = []

    def start(*args, **kwargs) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app(*args, **kwargs), host="127.0.0.1",
                                               port=port, log_level="critical"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.time() + 30
        while not server.started:
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.02)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def local(seed: int, answers: dict) -> dict:
    """The text env played in process with the same seed: each role's task reward."""
    played = evaluate(answers, episodes=1, seed=seed, task="course")["episodes"][0]
    return {role: turn["reward"] for role, turn in played.items()}


def test_a_client_plays_the_observer_against_a_hosted_pioneer(serve):
    url = serve("observer", {"pioneer": lambda p: "red"}, task="course")
    with GenericEnvClient(base_url=url).sync() as env:
        for seed in range(5):  # a bounded loop: one step per episode
            result = env.reset(seed=seed)
            obs = result.observation
            assert obs["role"] == "observer" and obs["prompt"].endswith("hint : red")
            answer = right(obs["prompt"]) if seed % 2 else copy(obs["prompt"])
            result = env.step({"answer": answer})
            assert result.done
            colour = right(obs["prompt"])
            expected = {"pioneer": float(colour == "red"), "observer": float(answer == colour)}
            assert result.observation["task_rewards"] == expected
            assert result.reward == sum(expected.values())  # the collective reward
            assert result.observation["answers"] == {"pioneer": "red", "observer": answer}
        assert env.state()["transcript"].endswith(answer)


def test_a_client_can_play_every_role_and_earns_the_text_envs_rewards(serve):
    url = serve(task="course")
    with GenericEnvClient(base_url=url).sync() as env:
        for seed in (3, 4):
            result = env.reset(seed=seed)
            roles = []
            for _ in range(4):  # two turns, then done
                if result.done:
                    break
                roles.append(result.observation["role"])
                policy = right if result.observation["role"] == "pioneer" else copy
                result = env.step({"answer": policy(result.observation["prompt"])})
            assert roles == ["pioneer", "observer"] and result.done
            assert result.observation["task_rewards"] == \
                local(seed, {"pioneer": right, "observer": copy}) == \
                {"pioneer": 1.0, "observer": 1.0}


def test_bad_roles_are_refused_before_serving_and_a_finished_episode_says_so():
    with pytest.raises(ValueError, match="no role 'judge'"):
        app("judge", task="course")
    env = CoryOpenEnv("pioneer", {"observer": copy}, task="course")
    first = env.reset(seed=0)
    done = env.step(CoryAction(answer=right(first.prompt)))
    assert done.done and done.reward == 2.0  # the hosted copycat copies a right answer
    with pytest.raises(RuntimeError, match="reset"):
        env.step(CoryAction(answer="red"))


def test_step_before_reset_and_a_bad_action_are_named():
    env = CoryOpenEnv("observer", task="course")
    with pytest.raises(RuntimeError, match="step before reset: call reset"):
        env.step(CoryAction(answer="red"))
    env.reset(seed=0)

    class Odd:
        answer = 5

    with pytest.raises(ValueError, match="field 'answer' must be a str"):
        env.step(Odd())


def test_http_calls_out_of_order_or_with_bad_values_are_named_not_500():
    from fastapi.testclient import TestClient

    with TestClient(app("observer", task="course")) as http:
        step = http.post("/step", json={"action": {"answer": "red"}})
        assert step.status_code == 409
        assert "step before reset" in step.json()["detail"] and "/ws" in step.json()["detail"]
        reset = http.post("/reset", json={"seed": 1, "options": "x"})
        assert reset.status_code == 422
        assert reset.json()["detail"] == "reset options must be a dict or None, got 'x'"
        assert http.post("/reset", json={"seed": 2}).json()["observation"]["role"] == "observer"


@pytest.mark.parametrize("bad", [{"max_connections": 0}, {"max_connections": 2.5}, {"idle_s": 0},
                                 {"idle_s": -1.0}])
def test_a_service_bound_that_serves_no_one_is_refused_by_name(bad):
    value = str(next(iter(bad.values())))
    with pytest.raises(ValueError, match=f"got {value}"):
        app("observer", task="course", **bad)


def test_the_cli_refuses_a_bad_bound_before_serving(capsys):
    from cory_env.openenv import main

    with pytest.raises(SystemExit):
        main(["--max-connections", "0"])
    assert "max_connections must be an int >= 1, got 0" in capsys.readouterr().err


def test_with_rounds_the_client_answers_once_a_round_and_a_game_pays_its_outcome():
    env = CoryOpenEnv(role="pioneer", task="course", rounds=3)
    obs, answers = env.reset(seed=0), 0
    while not obs.done:
        obs = env.step(CoryAction(answer="red red"))
        answers += 1
    assert answers == 3
    game = CoryOpenEnv(task="game", rounds=5, reward_mode="individual")
    obs = game.reset(seed=0)
    for move in ["[0]", "[4]", "[1]", "[8]", "[2]"]:  # player 0 takes the top row
        obs = game.step(CoryAction(answer=move))
    assert obs.done and obs.task_rewards == {"pioneer": 1.0, "observer": -1.0}


def test_with_rounds_each_observation_carries_what_was_paid_since_the_last_answer():
    from helpers import ToyTask

    class EachRound(ToyTask):
        round_rewards = "each"

    env = CoryOpenEnv(role="pioneer", task=EachRound(), rounds=2, reward_mode="individual",
                      policies={"observer": lambda prompt: "bad"})
    obs = env.reset(seed=0)
    assert obs.reward == 0.0
    obs = env.step(CoryAction(answer="good good"))
    assert not obs.done and obs.reward == 2.0  # round 1 paid the pioneer its own score
    obs = env.step(CoryAction(answer="good"))
    assert obs.done and obs.reward == 1.0 and obs.task_rewards == {"pioneer": 1.0,
                                                                    "observer": -1.0}
