"""The field's MARL libraries over the env, as docs/environment.md shows them: TorchRL's own
PettingZooWrapper and rollout (AEC and parallel, chains and rounds), a TorchRL-built IPPO that
learns the course task, and SuperSuit's wrappers."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchrl")
pytest.importorskip("supersuit")

DOC = Path(__file__).resolve().parents[2] / "docs/environment.md"


def doc_block(word: str) -> str:
    """The python block of docs/environment.md that uses `word`."""
    return next(b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
                if word in b)


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL's "tested with PettingZoo 1.24.3"
        yield


@pytest.mark.parametrize("kw", [{}, {"parallel": True}, {"n_agents": 3}, {"rounds": 2},
                                {"parallel": True, "n_agents": 3, "rounds": 2}])
def test_torchrl_wraps_the_env_and_rolls_it_out(kw):
    from agents.interop.torchrl import torchrl_env
    from cory_env.tasks.course import EOS, course_tokenizer

    env = torchrl_env(task="course", seed=0, **kw)
    k, rounds = kw.get("n_agents", 2), kw.get("rounds", 1)
    assert list(env.group_map) == [f"llm_{i}" for i in range(k)]
    eos = course_tokenizer().convert_tokens_to_ids(EOS)

    def words(td):  # TorchRL's random actions with `<eos>` swapped for a word: 2 tokens a turn
        td = env.rand_action(td)
        for group in env.group_map:
            action = td[group, "action"]
            td[group, "action"] = torch.where(action == eos, action + 1, action)
        return td

    td = env.rollout(100, policy=words)
    assert td.batch_size[0] == 2 * k * rounds  # every turn of one episode: 2 tokens each
    assert bool(td["next", "done"][-1])
    for i in range(k):  # each agent acts on its own 2 tokens of every round, in chain order
        acting = td[f"llm_{i}", "info", "acting"].reshape(-1).tolist()
        want = [1 if (t // 2) % k == i else 0 for t in range(2 * k * rounds)]
        assert acting == want
        mask = td[f"llm_{i}", "mask"].reshape(-1).tolist()
        assert mask == ([True] * len(want) if kw.get("parallel") else [bool(w) for w in want])


def test_a_torchrl_built_ippo_learns_the_course_task():
    from agents.interop.torchrl import TorchRLConfig, train_course_torchrl

    result = train_course_torchrl(seed=0, cfg=TorchRLConfig(iterations=24, episodes=32))
    curve = result["curve"]
    assert len(curve) == 24
    assert sum(curve[-4:]) / 4 >= sum(curve[:4]) / 4 + 0.25, curve  # a curve that moves
    again = train_course_torchrl(seed=0, cfg=TorchRLConfig(iterations=3, episodes=4))
    assert again == train_course_torchrl(seed=0, cfg=TorchRLConfig(iterations=3, episodes=4))


def test_the_docs_torchrl_and_supersuit_recipes_run_as_written():
    for word in ("torchrl_env", "supersuit"):
        scope: dict = {}
        exec(compile(doc_block(word), f"docs/environment.md ({word})", "exec"), scope)
    assert scope["obs"]["llm_0"].dtype.name == "float32" and scope["vec"].num_envs == 4
