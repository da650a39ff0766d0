"""What a learner needs from the processes it runs in, as one small object it calls.

    comm.prepare(policy)        # the policy its training passes go through (DDP/FSDP wrap it)
    comm.backward(loss)         # back-propagate (under DDP: through the accelerator)
    comm.all_ok(flag)           # True only if flag is True on every rank (skip together)
    comm.mean(x), comm.gather(t)  # statistics over the global batch

`Comm` is a single process: every call is a no-op or the identity. The multi-process versions
live in `agents/distributed/` and are handed to the learner by `DistributedTrainer`.
"""

from __future__ import annotations

import torch


class Comm:
    """A single process: the identity for every collective."""

    world_size = 1
    rank = 0

    def prepare(self, policy, critic: bool = False):
        """The module that training passes of `policy` go through (critic: values only)."""
        return policy

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate a loss."""
        loss.backward()

    def all_ok(self, flag: bool) -> bool:
        """True only if `flag` is True on every rank."""
        return bool(flag)

    def mean(self, value: float) -> float:
        """The mean of a float over ranks."""
        return float(value)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Equal-shaped tensors of every rank, concatenated along dim 0."""
        return x
