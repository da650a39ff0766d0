"""The worked example of a new learner: critic-free REINFORCE with a group baseline.

Everything a learner needs fits in this file: subclass `Learner` (here with CORY's structure
mixed in), register it, implement `update`. Here each response's return is its env reward
minus beta * (summed KL); the advantage is that return minus the mean of the global batch
(every rank's rows), divided by its std (GRPO-style), spread over every token of the response;
the clipped PPO loss is reused with the value loss off.

    python -m benchmarks.run --methods ppo,reinforce     # it is now a method like any other
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .cory import CoryStructure
from .learner import Learner, register_learner


@register_learner("reinforce")
class Reinforce(CoryStructure, Learner):
    """REINFORCE with a batch-mean baseline and no critic, on CORY's structure."""

    def agent_config(self, agent):
        """No critic: the value loss is off."""
        return replace(self.cfg.ppo, vf_coef=0.0)

    def update(self, turns, iteration):
        """One clipped policy-gradient update per agent from sequence-level advantages."""
        stats = {}
        for name, turn in turns.items():
            agent = self.agents[name]
            batch = agent.batch(turn)  # per-token rewards: -beta*KL + score on the last token
            returns = (batch.rewards * turn.response_mask).sum(1)
            every = self.comm.gather(returns)  # the global batch's statistics on every rank
            std = every.std() if len(every) > 1 else torch.zeros(())
            adv = (returns - every.mean()) / (std + 1e-8)
            batch.advantages = adv[:, None] * turn.response_mask
            batch.returns = returns[:, None] * turn.response_mask
            stats[name] = agent.learn(batch, turn, self.generator)
        return stats
