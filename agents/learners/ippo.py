"""Independent PPO: every LLM learns from its own turns with its own critic. Registered as the
algorithm `ppo` (the method `ppo` is one agent alone, `ippo` two agents side by side, `cory`
two on CORY's structure); the PPO maths and the update are `agents/learners/ppo.py`."""

from __future__ import annotations

from dataclasses import replace

from .base import Learner, register_learner, register_method, whiten_agents
from .ppo import prepare_advantages
from .structure import INDEPENDENT, SINGLE


@register_learner("ppo", structure=SINGLE)
class IPPO(Learner):
    """PPO for every LLM, each on its own turn with its own critic (independent PPO on two
    agents; the method `ppo` is one agent alone, `cory` two on CORY's structure)."""

    def update(self, turns, iteration):
        """PPO on each agent's own turn (advantages whitened per agent, or jointly)."""
        batches = {a: self.agents[a].batch(t) for a, t in turns.items()}
        cfg = self.cfg.ppo
        if cfg.whiten_advantages:
            raw = replace(cfg, whiten_advantages=False)
            for b in batches.values():
                prepare_advantages(b, raw)
            white = whiten_agents({a: b.advantages for a, b in batches.items()},
                                  {a: b.response_mask for a, b in batches.items()},
                                  self.cfg.per_agent_norm)
            for a, b in batches.items():
                b.advantages = white[a]
        return {a: self.agents[a].learn(b, turns[a], self.generator) for a, b in batches.items()}


register_method("ippo", "ppo", INDEPENDENT)
