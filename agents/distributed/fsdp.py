"""FSDP2 (torch `fully_shard`) for the learners: each rank keeps a shard of every agent.

`DistributedTrainer(cfg, accelerator, sharding="fsdp")` (or `accelerate launch` with an FSDP
config, or `python -m agents.distributed --fsdp`) uses it. Per agent:

* every decoder block (the model's `_no_split_modules`, e.g. `GPT2Block`, `LlamaDecoderLayer`)
  is one FSDP unit, and the policy as a whole (embeddings, LM head, value head) is the root
  unit. The frozen reference copy (one, shared by the agents) is sharded the same way as a
  root of its own. The PPO pass enters through the root, so FSDP all-gathers
  each unit's parameters just in time and reduce-scatters the gradients in backward;
* the rollout decodes token by token through the raw modules, and ranks decode different
  numbers of steps. So `gathered` all-gathers every unit once before the rollout and keeps the
  full parameters until it ends: no collective runs inside the rollout;
* the optimizer is rebuilt on the sharded parameters (Adam state is sharded too);
* checkpoints hold full tensors in the same layout as unsharded runs (`full_state`), so a
  checkpoint moves between FSDP, DDP and single-process runs and between world sizes.

Not supported (refused with a clear error): 4-bit weights and two LoRA adapters on one shared
base (the two agents would have to share one sharded module).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from ..training.checkpoint import like


def block_classes(policy) -> set[str]:
    """Names of the model's decoder-block classes (HF's `_no_split_modules`)."""
    names = set(getattr(policy.hf_model, "_no_split_modules", None) or ())
    if not names:
        raise ValueError(f"{type(policy.hf_model).__name__} names no decoder-block class "
                         f"(_no_split_modules); FSDP needs one to shard by block")
    return names


def check_shardable(policies: dict) -> None:
    """Refuse what FSDP cannot shard here, naming the agent."""
    seen: dict[int, str] = {}
    for name, policy in policies.items():
        if getattr(policy, "is_quantized", False):
            raise ValueError(f"FSDP cannot shard 4-bit weights ({name}); use DDP with "
                             f"load_in_4bit, or FSDP without it")
        other = seen.setdefault(id(policy.model), name)
        if other != name:
            raise ValueError(f"{other} and {name} share one base model (shared LoRA pair); "
                             f"FSDP needs separate models: set shared_base=False, or use DDP")


def shard(module: nn.Module, policy) -> nn.Module:
    """fully_shard each decoder block inside `module`, then `module` as the root unit.

    Parameters stay float32; bf16 comes from the policy's own autocast (on CUDA by default),
    as under DDP, so the value head keeps running in float32.
    """
    # The losses use the outputs out of place, which is all that this warning asks for.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    names = block_classes(policy)
    ref = getattr(policy, "ref_model", None)
    if ref is not None:  # one reference may serve both agents: make it a root of its own
        del policy._modules["ref_model"]
        object.__setattr__(policy, "ref_model", ref)
    for root in ([ref] if ref is not None else []) + [module]:
        if isinstance(root, FSDPModule):
            continue  # the shared reference, already sharded for the other agent
        for sub in list(root.modules()):
            if type(sub).__name__ in names and not isinstance(sub, FSDPModule):
                fully_shard(sub)
        fully_shard(root)
        # Mark it as the root now: otherwise the rollout, which calls blocks directly, would
        # make each block a root of its own. (FSDP2 does this at the first root forward.)
        root._get_fsdp_state()._lazy_init()
    policy.refresh_trainable_parameters()
    return module


def _units(modules) -> list[FSDPModule]:
    return [m for root in modules for m in root.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(modules):
    """Full parameters on every rank inside the block (for the rollout), sharded after it."""
    units = _units(modules)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)


# ----------------------------------------------------------------------------- checkpoints

def full_state(obj):
    """`obj` with every DTensor replaced by its full tensor on CPU (a collective: all ranks)."""
    if isinstance(obj, DTensor):
        return obj.full_tensor().cpu()
    if isinstance(obj, dict):
        return {k: full_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(full_state(v) for v in obj)
    return obj


def shard_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After `load_state_dict` of full tensors, shard each state tensor like its parameter."""
    for param, state in optimizer.state.items():
        if not isinstance(param, DTensor):
            continue
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.shape == param.shape:
                state[key] = like(value, param)
