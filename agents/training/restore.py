"""A saved run read back: the TrainConfig of a checkpoint, and one of its agents as a function.

    from agents.training.restore import checkpoint_policy
    answer = checkpoint_policy("runs/x/ckpt/cory-seed0.pt", agent="llm_1")
    answer("colour of snow ?")
"""

from __future__ import annotations

from cory_common import cli
from cory_common.pretrained import load_tokenizer
from cory_env import make_task

from ..llm.sampling import SamplingConfig
from ..llm.text import TextPolicy
from .checkpoint import load_trainable_state, read_checkpoint
from .config import TrainConfig, tokenizer_folder
from .train import build_policies, model_of


def saved_config(state: dict) -> TrainConfig:
    """The TrainConfig a checkpoint was written under (its `run_config` read back; an earlier
    version's setting names read as today's)."""
    values = {}
    for key, value in state["config"].items():
        path = tuple(key.split("."))
        _, tp = cli.field_at(TrainConfig, path)
        values[path] = cli.literal(value) if isinstance(value, str) and tp is not str else value
    return cli.apply(TrainConfig(), values).validate()


def load_agents(path: str, agents: list[str]) -> tuple[TrainConfig, dict, dict]:
    """A checkpoint's TrainConfig, the named agents' policies rebuilt from it with their trained
    weights, and the checkpoint's state; a ValueError naming an agent it does not hold."""
    state = read_checkpoint(path)
    for agent in agents:
        if agent not in state["policies"]:
            raise ValueError(f"checkpoint {path} has no agent {agent!r}; it has "
                             f"{sorted(state['policies'])}")
    cfg = saved_config(state)
    policies = build_policies(cfg, agents)
    for agent in agents:
        load_trainable_state(policies[agent], state["policies"][agent],
                             f"checkpoint {path} ({agent})")
    return cfg, policies, state


def checkpoint_policy(path: str, agent: str = "llm_0", max_new_tokens: int | None = None,
                      sampling: SamplingConfig | None = None, seed: int = 0) -> TextPolicy:
    """One agent of a learner's checkpoint (`Trainer.save`, a benchmark's ckpt/) as a
    str -> str function, rebuilt from the checkpoint's own saved config."""
    cfg, policies, _ = load_agents(path, [agent])
    policy = policies[agent]
    task = make_task(cfg.task, **cfg.task_options)
    cap = max_new_tokens or cfg.max_new_tokens or task.default_max_new_tokens
    return TextPolicy(policy, run_tokenizer(cfg, task), cap, sampling, seed)


def run_tokenizer(cfg: TrainConfig, task):
    """A run's tokenizer: its model's, else the task's own."""
    folder = tokenizer_folder(model_of(cfg, "llm_0"))
    return load_tokenizer(folder) if folder else task.tokenizer
