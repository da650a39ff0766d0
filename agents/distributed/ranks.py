"""The multi-process `Comm`s: what a learner calls, over DDP replicas or FSDP2 shards.

* `DDPComm.prepare` wraps a policy so its training passes go through DistributedDataParallel
  (`_Call` routes `policy.evaluate` and `policy(...)` through the wrapper's forward, so DDP sees
  the pass and all-reduces the gradients in backward). Only the policy's own trainable
  parameters are registered with DDP: frozen weights, the reference copy and the other LoRA
  adapter of a shared base are ignored, so a shared-LoRA pair works too.
* `FSDPComm.prepare` shards the policy per decoder block instead (`fsdp.py`); the learner then
  builds its optimizer on the sharded parameters.
* `all_ok`, `mean` and `gather` are the collectives that make every rank skip the same
  minibatches (a one-sided skip would hang the all-reduce) and that let the KL controller and
  the score statistics see the global batch.
"""

from __future__ import annotations

from dataclasses import fields

import torch
from torch import nn

from ..learners.comm import Comm
from ..llm.policy import Evaluation
from .fsdp import check_shardable, shard


class _Call(nn.Module):
    """Routes a policy method through forward(), so a DDP wrapper around it sees the pass."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, method: str, *args, **kwargs):
        out = getattr(self.policy, method)(*args, **kwargs)
        if isinstance(out, Evaluation):  # a dict: DDP and accelerate's fp32 cast walk dicts
            return {f.name: getattr(out, f.name) for f in fields(out)
                    if getattr(out, f.name) is not None}
        return out


class SyncedPolicy:
    """A policy whose `evaluate` and `__call__` run through a (DDP) wrapper; all else is its own.

    `ppo_update` calls `evaluate` and MAPPO calls the critic, so those passes synchronise the
    gradients; the rollout keeps using the raw policy (`learner.policies`), which needs no sync.
    """

    def __init__(self, policy, wrapped: nn.Module):
        self.policy, self.wrapped = policy, wrapped

    def evaluate(self, input_ids, attention_mask, n_response, **kwargs) -> Evaluation:
        """`policy.evaluate` through the wrapper."""
        return Evaluation(**self.wrapped("evaluate", input_ids, attention_mask, n_response,
                                         **kwargs))

    def values(self, input_ids, attention_mask):
        """`policy.values` (a critic's pass) through the wrapper."""
        return self.wrapped("values", input_ids, attention_mask)

    def __call__(self, *args, **kwargs):
        """`policy.forward` through the wrapper."""
        return self.wrapped("forward", *args, **kwargs)

    def __getattr__(self, name):
        if name in ("policy", "wrapped"):
            raise AttributeError(name)
        return getattr(self.policy, name)


def wrap_policy(policy, accelerator, head_unused: bool = False) -> SyncedPolicy:
    """DDP-wrap one policy so that only its own trainable parameters are synchronised.

    head_unused: the output embedding gets no gradient (a critic trains only its values);
    an untied one is then left out of DDP, which otherwise waits for its gradient forever.
    """
    module = _Call(policy)
    mine = {id(p) for p in policy.trainable_parameters()}
    if head_unused:
        hf = policy.hf_model
        head, emb = hf.get_output_embeddings().weight, hf.get_input_embeddings().weight
        if head is not emb:
            mine.discard(id(head))
    module._ddp_params_and_buffers_to_ignore = [
        name for name, p in module.named_parameters(remove_duplicate=False) if id(p) not in mine
    ] + [name for name, _ in module.named_buffers(remove_duplicate=False)]
    return SyncedPolicy(policy, accelerator.prepare_model(module, device_placement=False))


class DDPComm(Comm):
    """Collectives of an `accelerate` launch; policies train through DDP wrappers."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.world_size = accelerator.num_processes
        self.rank = accelerator.process_index

    def prepare(self, policy, critic: bool = False):
        """`policy` DDP-wrapped (a critic's unused LM head is left out)."""
        if isinstance(policy, SyncedPolicy):
            return policy
        return wrap_policy(policy, self.accelerator, head_unused=critic)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate through the accelerator, with the learner's scaling as the only one.

        `accelerator.backward` divides by its gradient_accumulation_steps (set by an accelerate
        config or ACCELERATE_GRADIENT_ACCUMULATION_STEPS); the updates already weight each pass
        by its share of the optimizer step, so that division is undone here.
        """
        steps = getattr(self.accelerator, "gradient_accumulation_steps", 1) or 1
        self.accelerator.backward(loss * steps)

    def _tensor(self, values, dtype=torch.float64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.accelerator.device)

    def all_ok(self, flag: bool) -> bool:
        """True only if flag is True on every rank."""
        if self.world_size == 1:
            return bool(flag)
        t = self._tensor([1.0 if flag else 0.0])
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        return bool(t.item() > 0)

    def mean(self, value: float) -> float:
        """The mean of a float over ranks."""
        if self.world_size == 1:
            return float(value)
        t = self._tensor([float(value)])
        torch.distributed.all_reduce(t)
        return float(t.item()) / self.world_size

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate equal-shaped tensors from all ranks along dim 0."""
        if self.world_size == 1:
            return x
        x = x.detach().contiguous().to(self.accelerator.device)
        out = [torch.empty_like(x) for _ in range(self.world_size)]
        torch.distributed.all_gather(out, x)
        return torch.cat(out)

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.world_size == 1:
            return
        if self.accelerator.device.type == "cpu":  # accelerate would pass device_ids=[rank],
            torch.distributed.barrier()  # which fails for gloo ranks on a host with fewer GPUs
        else:
            self.accelerator.wait_for_everyone()

    def gather_object(self, obj) -> list:
        """Every rank's picklable object, in rank order."""
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out


class FSDPComm(DDPComm):
    """Collectives of an `accelerate` launch; each policy is sharded per decoder block."""

    def __init__(self, accelerator):
        super().__init__(accelerator)
        self.sharded: dict[str, object] = {}  # name -> policy, for `check_shardable`

    def prepare(self, policy, critic: bool = False):
        """`policy` sharded with FSDP2 (the optimizer must be built afterwards)."""
        if isinstance(policy, SyncedPolicy):
            return policy
        name = "critic" if critic else getattr(policy, "adapter_name", None)
        self.sharded[name or f"model {len(self.sharded)}"] = policy
        check_shardable(self.sharded)
        return SyncedPolicy(policy, shard(_Call(policy), policy))
