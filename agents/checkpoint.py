"""Full-state checkpoints: a resumed run continues exactly where the killed one stopped.

A checkpoint holds both agents' trainable weights (all weights under full fine-tuning, the
adapters + value heads under LoRA), the critic, every optimizer, KL controller and score
statistics, the position in the role schedule (the iteration), the query sampler and all RNG
states. Writes are atomic: a checkpoint is either whole or absent.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from cory_env.files import atomic_write

FORMAT = 1


def trainable_state(policy) -> dict[str, torch.Tensor]:
    """The policy's trainable tensors by name (adapters + value head under LoRA)."""
    mine = {id(p) for p in policy.trainable_parameters()}
    return {n: _host_copy(p.detach()) for n, p in policy.named_parameters() if id(p) in mine}


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy; an FSDP shard (DTensor) is left on its device for the full-state gather,
    since `.cpu()` of a DTensor keeps its CUDA mesh and the later gather would run NCCL on CPU."""
    return t if type(t).__name__ == "DTensor" else t.cpu().clone()


def load_trainable_state(policy, state: dict[str, torch.Tensor]) -> None:
    """Copy saved trainable tensors back into the policy, naming any missing one."""
    params = dict(policy.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            if name not in params:
                raise KeyError(f"checkpoint tensor {name!r} has no parameter in the policy")
            param = params[name]
            if type(param).__name__ == "DTensor":  # FSDP: keep this rank's shard of the value
                from .distributed.fsdp import like

                value = like(value, param)
            param.copy_(value)


def trainer_state(trainer) -> dict:
    """Everything needed to continue a Trainer bit for bit."""
    learner = trainer.learner
    state = {
        "format": FORMAT,
        "iteration": trainer.iteration,
        "method": trainer.cfg.method, "task": trainer.cfg.task, "seed": trainer.cfg.seed,
        "policies": {a: trainable_state(p) for a, p in learner.policies.items()},
        "learner": learner.state_dict(),
        "env_rng": trainer.env.rng_state(),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
    }
    if getattr(learner, "critic", None) is not None:
        state["critic"] = trainable_state(learner.critic)
    return state


def load_trainer_state(trainer, state: dict) -> None:
    """Restore a Trainer from trainer_state(), checking it belongs to the same run."""
    for key in ("method", "task", "seed"):
        if state[key] != getattr(trainer.cfg, key):
            raise ValueError(f"checkpoint is for {key}={state[key]!r}, "
                             f"not {getattr(trainer.cfg, key)!r}")
    learner = trainer.learner
    for agent, weights in state["policies"].items():
        load_trainable_state(learner.policies[agent], weights)
    if "critic" in state:
        load_trainable_state(learner.critic, state["critic"])
    learner.load_state_dict(state["learner"])
    trainer.env.set_rng_state(state["env_rng"])
    torch.set_rng_state(state["torch_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])
    trainer.iteration = state["iteration"]


def atomic_save(obj, path: str) -> None:
    """torch.save, whole or absent (`cory_env.files.atomic_write`)."""
    atomic_write(path, lambda f: torch.save(obj, f))


def save_checkpoint(trainer, path: str) -> None:
    """Atomically write the trainer's full state to path."""
    atomic_save(trainer_state(trainer), path)


def load_checkpoint(trainer, path: str) -> None:
    """Restore the trainer's full state from path."""
    load_trainer_state(trainer, torch.load(path, map_location="cpu", weights_only=False))
