"""The worked example of a new learner: critic-free REINFORCE with a group baseline.

Everything a learner needs fits in this file: subclass `Learner`, register it (its bare name is
the learner on one agent; `cory-reinforce` is the method on CORY's structure), implement `update`.
Here each response's return is its env reward minus kl_coef * (summed KL); the advantage is
that return minus the mean of the global batch (every rank's rows), divided by its std
(GRPO-style), spread over every token of the response; the clipped PPO loss is reused with the
value loss off. It trains on rounds (`takes_rounds`): a return spans an agent's turns of an
episode under `credit="episode"`.

    python -m benchmarks.run --methods ppo,reinforce          # on one agent, beside PPO
    python -m benchmarks.run --methods cory,cory-reinforce    # on CORY's structure
    python -m benchmarks.run --methods reinforce/cory-no-kt   # on any registered structure
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .cory import CORY
from .credit import episode_returns
from .learner import Learner, norm_groups
from .registry import register_learner, register_method


@register_learner("reinforce")
class Reinforce(Learner):
    """REINFORCE with a batch-mean baseline and no critic."""

    takes_rounds = True

    def agent_config(self, agent):
        """No critic: the value loss is off."""
        return replace(super().agent_config(agent), vf_coef=0.0)

    def update(self, turns, iteration):
        """One clipped policy-gradient update per agent from sequence-level advantages."""
        batches = {a: self.agents[a].batch(t) for a, t in turns.items()}  # -kl_coef*KL + score
        returns = {a: episode_returns((b.rewards * b.response_mask).sum(1), self.credit_span(b))
                   for a, b in batches.items()}
        # the baseline's statistics: the global batch (every rank), per agent or over both
        gathered = {a: self.comm.gather(r) for a, r in returns.items()}
        pools = {}
        for members in norm_groups(list(returns), self.cfg.per_agent_norm):
            pool = gathered[members[0]] if len(members) == 1 else \
                torch.cat([gathered[a].cpu() for a in members])
            pools.update(dict.fromkeys(members, pool))
        stats = {}
        for a, b in batches.items():
            every = pools[a].to(returns[a].device)
            std = every.std() if len(every) > 1 else torch.zeros((), device=every.device)
            adv = (returns[a] - every.mean()) / (std + 1e-8)
            b.advantages = adv[:, None] * b.response_mask
            b.returns = returns[a][:, None] * b.response_mask
            stats[a] = self.agents[a].learn(b, turns[a], self.generator)
        return stats


register_method("cory-reinforce", "reinforce", CORY)  # reinforce on CORY's structure
