"""REINFORCE++ (Hu 2025, arXiv 2501.03262): REINFORCE with PPO's tricks and no critic.

Per-token rewards are -kl_coef * KL_t on every response token plus the score on the last one (the
KL in the reward, token by token); each token's return is the reward-to-go
G_t = sum_{s >= t} gamma^(s-t) r_s, and the advantages are the returns normalised over the
global batch (every token of every answer, on every rank; per agent unless
`per_agent_norm=False`). The loss is PPO's clipped surrogate. No groups needed (G = 1 by
default; with G > 1 it is the same estimator on grouped samples).
"""

from __future__ import annotations

import torch

from .cory import CORY
from .credit import episodes_of, split_turns
from .group import GroupLearner
from .learner import whiten_agents
from .ppo import gae
from .registry import register_learner, register_method


@register_learner("reinforce-pp")
class ReinforcePP(GroupLearner):
    """Token-level KL in the reward, reward-to-go returns, global-batch normalisation."""

    group_size = 1
    min_group = 1
    kl_where, kl_where_fixed = "reward", True

    def update(self, turns, iteration):
        """Clipped policy-gradient updates from globally normalised reward-to-go."""
        cfg = self.cfg.ppo
        batches = {a: self.agents[a].batch(t) for a, t in turns.items()}
        for b in batches.values():  # values 0 and lambda 1: GAE is the discounted reward-to-go
            r = self.credit_span(b)
            _, returns = gae(episodes_of(b.rewards.float(), r), episodes_of(
                torch.zeros_like(b.rewards), r), episodes_of(b.response_mask, r), cfg.gamma, 1.0)
            b.returns = split_turns(returns, r)
        white = whiten_agents({a: b.returns for a, b in batches.items()},
                              {a: b.response_mask for a, b in batches.items()},
                              self.cfg.per_agent_norm, gather=self.comm.gather)
        for a, b in batches.items():
            b.advantages = white[a]
        return {a: self.agents[a].learn(b, turns[a], self.generator)
                for a, b in batches.items()}


register_method("cory-reinforce-pp", "reinforce-pp", CORY)  # reinforce-pp on CORY's structure
