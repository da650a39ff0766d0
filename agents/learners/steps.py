"""Optimizer steps that every rank skips together: the epoch's row slices and the clipped step.

    for start, rows in step_slices(B, cfg.backward_batch_size, generator):   # one epoch
        optimizer.zero_grad(set_to_none=True)
        reason = ...accumulate the gradients of `rows`, or say why not...
        norm = clip_and_step(optimizer, params, max_norm, reason, all_ok, "PPO: skipping ...")

Used by the PPO update (`ppo.ppo_update`) and MAPPO's critic (`mappo.MAPPO.update_critic`);
`forward_passes` splits one step's rows into the passes that accumulate its gradients.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from torch import Tensor


def step_slices(n_rows: int, step_size: int,
                generator: torch.Generator | None) -> list[tuple[int, torch.Tensor]]:
    """One epoch's optimizer steps: (first position, rows) of a fresh permutation, in slices."""
    perm = torch.randperm(n_rows, generator=generator)
    return [(start, perm[start:start + step_size]) for start in range(0, n_rows, step_size)]


def clip_and_step(optimizer: torch.optim.Optimizer, params: list, max_norm: float,
                  reason: str | None, all_ok: Callable[[bool], bool], skipping: str
                  ) -> float | None:
    """Clip the accumulated gradients and step; or, given a `reason` or a norm that is not
    finite on some rank, drop them and warn "`skipping`: reason". The norm, or None if skipped."""
    if reason is None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
        if not all_ok(math.isfinite(norm)):
            reason = f"non-finite grad norm {norm}"
    if reason:
        optimizer.zero_grad(set_to_none=True)
        warnings.warn(f"{skipping}: {reason}", RuntimeWarning, stacklevel=3)
        return None
    optimizer.step()
    return norm


def forward_passes(step_idx: Tensor, attention_mask: Tensor, rows: int,
                   max_tokens: int | None = None) -> list[Tensor]:
    """Split one optimizer step's rows into forward/backward passes of at most `rows` rows.

    With `max_tokens`, the rows are sorted by unpadded width (longest first) and packed so that
    rows x the widest row's width stays within it; a row wider than the cap runs by itself.
    """
    if max_tokens is None:
        return list(step_idx.split(rows))
    real = attention_mask[step_idx.to(attention_mask.device)].bool()
    width = (real.shape[1] - real.int().argmax(1)).tolist()  # from the first real column
    order = sorted(range(len(width)), key=lambda i: -width[i])
    passes, current = [], []
    for i in order:
        if current and (len(current) == rows
                        or (len(current) + 1) * width[current[0]] > max_tokens):
            passes.append(current)
            current = []
        current.append(i)
    passes.append(current)
    return [step_idx[torch.tensor(p, dtype=torch.long)] for p in passes]
