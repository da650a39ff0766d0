"""The critic-free group-baseline family's shared part: G answers per query, a baseline each.

A `GroupLearner` asks the env for G answers to every query (`group_size`, contiguous rows), turns
each answer's return into an advantage with `advantages` (the one method a member defines), spreads
it over the answer's tokens and runs the clipped policy loss with the value loss off. An answer's
return is its shaped score (`PPOAgent.batch`: scaling, normalisation, clipping) minus kl_coef * its
summed KL when the KL is in the reward. On CORY's structure (`cory-<name>`, or `<name>/cory`) each
group member is a whole pioneer -> observer episode, and each agent's G answers to a query are its
group; with `per_agent_norm=False` one group pools both agents' answers (Dr. MAS, Feng et al. 2026,
arXiv 2602.08847, shows the per-agent statistics keep the gradient scale stable, so per-agent is
the default).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .credit import episode_returns
from .learner import Learner, norm_groups


class GroupLearner(Learner):
    """Sequence-level advantages from groups of G answers per query; no critic."""

    takes_rounds = True
    group_size = 4
    min_group = 2  # the smallest G whose baseline means anything
    kl_where = "loss"
    loss_agg = "token-mean"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.group < self.min_group:
            raise ValueError(f"{self.name} needs group_size >= {self.min_group} answers per "
                             f"query, got {self.group}")

    def agent_config(self, agent):
        """No value loss; the family's KL placement and loss aggregation."""
        return replace(super().agent_config(agent), vf_coef=0.0, loss_agg=self.loss_agg)

    def advantages(self, returns: torch.Tensor, group: int) -> torch.Tensor:
        """(B,) advantages of (B,) returns that come in contiguous groups of `group`."""
        raise NotImplementedError

    def grouped(self, returns: dict[str, torch.Tensor], group: int) -> dict[str, torch.Tensor]:
        """`advantages` per agent, or over groups that pool every agent's answers."""
        out = {}
        for names in norm_groups(list(returns), self.cfg.per_agent_norm):
            if len(names) == 1:
                out[names[0]] = self.advantages(returns[names[0]], group)
                continue
            dev, n = returns[names[0]].device, len(returns[names[0]]) // group
            pooled = torch.cat([returns[a].to(dev).view(n, group) for a in names], 1)  # (n, A*G)
            adv = self.advantages(pooled.flatten(), group * len(names)).view(n, -1)
            out.update({a: adv[:, k * group:(k + 1) * group].flatten().to(returns[a].device)
                        for k, a in enumerate(names)})
        return out

    def update(self, turns, iteration):
        """Clipped policy-gradient updates from each answer's group advantage."""
        batches = {a: self.agents[a].batch(t) for a, t in turns.items()}
        returns = {a: episode_returns((b.rewards * b.response_mask).sum(1), self.credit_span(b))
                   for a, b in batches.items()}  # with rounds: each episode's, on every turn
        group = next(iter(turns.values())).group_size
        adv = self.grouped(returns, group)
        stats = {}
        for a, b in batches.items():
            b.advantages = adv[a][:, None] * b.response_mask
            b.returns = returns[a][:, None] * b.response_mask
            stats[a] = self.agents[a].learn(b, turns[a], self.generator)
        return stats


def group_stats(returns: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B/G, G) returns, and each group's (B/G, 1) mean."""
    r = returns.view(-1, group)
    return r, r.mean(1, keepdim=True)
