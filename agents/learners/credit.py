"""Credit across turns: an agent's turns of one episode as one trajectory.

With rounds (the env's `rounds=R`) an agent's turns come stacked round-major, (R * B, T). For
GAE across turns (`PPOConfig.credit="episode"`, the default) each episode's R turns are laid
end to end, (B, R * T); GAE skips the masked columns, so the value of the agent's next turn
bootstraps the last token of the turn before it, and the other agents' tokens in between are
the environment's transition. `credit="turn"` keeps every turn a trajectory of its own.
"""

from __future__ import annotations

import torch

CREDITS = ("episode", "turn")


def credit_span(rounds: int, credit: str) -> int:
    """How many of an agent's turns one trajectory spans: all R of its episode under
    `credit="episode"`, one under "turn"."""
    return rounds if credit == "episode" else 1


def episodes_of(x: torch.Tensor, rounds: int) -> torch.Tensor:
    """(R * B, T) turns, round-major -> (B, R * T): each episode's turns end to end."""
    if rounds == 1:
        return x
    _, t = x.shape
    return x.reshape(rounds, -1, t).transpose(0, 1).reshape(-1, rounds * t)


def split_turns(x: torch.Tensor, rounds: int) -> torch.Tensor:
    """The inverse of `episodes_of`: (B, R * T) -> (R * B, T)."""
    if rounds == 1:
        return x
    b, rt = x.shape
    return x.reshape(b, rounds, rt // rounds).transpose(0, 1).reshape(-1, rt // rounds)


def episode_returns(scores: torch.Tensor, rounds: int) -> torch.Tensor:
    """(R * B,) per-turn scores -> the same rows holding each episode's sum over its turns
    (what a group baseline compares: one return per episode, given to each of its turns)."""
    if rounds == 1:
        return scores
    return scores.reshape(rounds, -1).sum(0).repeat(rounds)
