"""Full-state checkpoints: a resumed run continues exactly where the killed one stopped.

A checkpoint holds both agents' trainable weights (all weights under full fine-tuning, the
adapters + value heads under LoRA), the critic, every optimizer, KL controller and score
statistics, the position in the role schedule (the iteration), the query sampler and all RNG
states. Writes are atomic: a checkpoint is either whole or absent.
"""

from __future__ import annotations

import os
import random
import warnings

import numpy as np
import torch

from cory_common.cli import flatten
from cory_common.files import atomic_write

FORMAT = 4  # 4: the KL controller keeps "coef"; 3: the batch stored once; 2: only the rotation
# Settings a resumed run may change: they do not change what the next iterations compute.
RESUMABLE_CHANGES = ("iterations", "device", "placement")


def trainable_state(policy) -> dict[str, torch.Tensor]:
    """The policy's trainable tensors by name (adapters + value head under LoRA)."""
    mine = {id(p) for p in policy.trainable_parameters()}
    return {n: _host_copy(p.detach()) for n, p in policy.named_parameters() if id(p) in mine}


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy; an FSDP shard (DTensor) is left on its device for the full-state gather,
    since `.cpu()` of a DTensor keeps its CUDA mesh and the later gather would run NCCL on CPU."""
    return t if type(t).__name__ == "DTensor" else t.cpu().clone()


def load_trainable_state(policy, state: dict[str, torch.Tensor], where: str = "checkpoint"
                         ) -> None:
    """Copy saved trainable tensors back into the policy, naming any missing or misshapen one."""
    params = dict(policy.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            if name not in params:
                raise ValueError(f"{where}: tensor {name!r} has no parameter in the policy "
                                 f"(a different architecture or LoRA setting?)")
            param = params[name]
            if tuple(param.shape) != tuple(value.shape):
                raise ValueError(f"{where}: {name} has shape {tuple(value.shape)}, the model's "
                                 f"is {tuple(param.shape)} (a different architecture)")
            param.copy_(like(value, param))


def like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A full tensor laid out like `param`: sharded the same way when `param` is a DTensor
    (FSDP: this rank keeps its shard of the value)."""
    if type(param).__name__ == "DTensor" and type(value).__name__ != "DTensor":
        from torch.distributed.tensor import distribute_tensor

        value = value.to(device=param.device, dtype=param.dtype)
        return distribute_tensor(value, param.device_mesh, param.placements)
    return value


def trainer_state(trainer) -> dict:
    """Everything needed to continue a Trainer bit for bit."""
    learner = trainer.learner
    state = {
        "format": FORMAT,
        "iteration": trainer.iteration,
        "method": trainer.cfg.method, "task": trainer.cfg.task, "seed": trainer.cfg.seed,
        "config": run_config(trainer.cfg),
        "policies": {a: trainable_state(p) for a, p in learner.policies.items()},
        "learner": learner.state_dict(),
        "env_rng": trainer.env.rng_state(),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
    }
    for name, model in learner.extra_models().items():
        state.setdefault("extra", {})[name] = trainable_state(model)
    return state


def run_config(cfg) -> dict[str, object]:
    """A config dataclass as {"ppo.lr": value, ...}: what a checkpoint records of its run."""
    out = {}
    for path, value in flatten(cfg).items():
        out[".".join(path)] = value if isinstance(value, (bool, int, float, str, type(None),
                                                          list, dict)) else repr(value)
    return out


def config_differences(saved: dict, now: dict, allowed=RESUMABLE_CHANGES, label: str = "now",
                       base: str = "saved") -> tuple[list[str], list[str]]:
    """(refused, allowed): 'field: saved X, now Y' (`base` and `label` name the two sides) for
    each setting of two `run_config`s that differs; a field that is, or lies under, an entry of
    `allowed` (a name or a dotted path such as "train.device") may differ."""
    refused, may_differ = [], []
    for key in sorted(set(saved) | set(now)):
        if saved.get(key) != now.get(key):
            line = f"{key}: {base} {saved.get(key)!r}, {label} {now.get(key)!r}"
            free = any(key == k or key.startswith(k + ".") for k in allowed)
            (may_differ if free else refused).append(line)
    return refused, may_differ


def load_trainer_state(trainer, state: dict, where: str = "checkpoint") -> None:
    """Restore a Trainer from trainer_state(), refusing a checkpoint of another run.

    The saved configuration is compared field by field: a difference that changes the run
    is refused with every such field and both values named; `RESUMABLE_CHANGES` (the number
    of iterations, the device and the placement) are allowed.
    """
    if not isinstance(state, dict) or "policies" not in state:
        raise ValueError(f"{where} is not a cory Trainer checkpoint (format {FORMAT})")
    if state.get("format") != FORMAT:
        raise ValueError(f"{where} is checkpoint format {state.get('format')}, this version "
                         f"reads format {FORMAT} only: resume it with the version that wrote it")
    if "config" in state:
        refused, allowed = config_differences(state["config"], run_config(trainer.cfg))
        if allowed and not refused:
            warnings.warn(f"{where}: resuming with changed settings that keep the run the same: "
                          + "; ".join(allowed), RuntimeWarning, stacklevel=3)
        if refused:
            raise ValueError(f"{where} was saved by a run with other settings; resume with the "
                             f"saved ones (only {', '.join(RESUMABLE_CHANGES)} may change): "
                             + "; ".join(refused))
    for key in ("method", "task", "seed"):
        if state[key] != getattr(trainer.cfg, key):
            raise ValueError(f"{where} is for {key}={state[key]!r}, "
                             f"not {getattr(trainer.cfg, key)!r}")
    learner = trainer.learner
    if set(state["policies"]) != set(learner.policies):
        raise ValueError(f"{where} holds agents {sorted(state['policies'])}, the trainer "
                         f"{sorted(learner.policies)}")
    for agent, weights in state["policies"].items():
        load_trainable_state(learner.policies[agent], weights, f"{where} ({agent})")
    saved = state.get("extra", {"critic": state["critic"]} if "critic" in state else {})
    models = learner.extra_models()
    if set(saved) != set(models):
        raise ValueError(f"{where} holds the learner's own models {sorted(saved)}, the trainer "
                         f"{sorted(models)}")
    for name, weights in saved.items():
        load_trainable_state(models[name], weights, f"{where} ({name})")
    learner.load_state_dict(state["learner"])
    trainer.env.set_rng_state(state["env_rng"])
    torch.set_rng_state(state["torch_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])
    trainer.iteration = state["iteration"]


def atomic_save(obj, path: str) -> None:
    """torch.save, whole or absent (`cory_common.files.atomic_write`)."""
    atomic_write(path, lambda f: torch.save(obj, f))


def save_checkpoint(trainer, path: str) -> None:
    """Atomically write the trainer's full state to path."""
    atomic_save(trainer_state(trainer), path)


def read_checkpoint(path: str) -> dict:
    """torch.load a checkpoint, naming the file in every error."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path}: no such file")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # pickle / zip / torch errors of a corrupt or foreign file
        raise ValueError(f"checkpoint {path} cannot be read (corrupt, or not a torch file): "
                         f"{type(err).__name__}: {err}") from None


def load_checkpoint(trainer, path: str) -> None:
    """Restore the trainer's full state from path."""
    load_trainer_state(trainer, read_checkpoint(path), f"checkpoint {path}")
