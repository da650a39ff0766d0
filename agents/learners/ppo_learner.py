"""The `ppo` learner: every LLM learns from its own turns with PPO and its own critic. On the
structure `single` it is the method `ppo`, on `independent` the method `ippo` (independent
PPO), on CORY's `cory`; the PPO maths and one update are `agents/learners/ppo.py`."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..llm.rollout import Turn, stack_rows
from .learner import Learner, whiten_agents
from .ppo import PPOBatch, prepare_advantages
from .registry import register_learner, register_method
from .structure import INDEPENDENT


@register_learner("ppo")
class PPO(Learner):
    """PPO for every LLM, each on its own turn with its own critic. On a
    structure with one shared policy (`cory-shared`), one update from every position's turns."""

    shares_policy = True
    takes_rounds = True

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
        if self.structure.shared_policy:
            return self.update_shared(batches, turns)
        return {a: self.agents[a].learn(b, turns[a], self.generator) for a, b in batches.items()}

    def update_shared(self, batches: dict, turns: dict) -> dict:
        """One PPO update of the one policy on every position's turns together, in one model's
        optimizer steps (`Structure.matched_steps`: each step accumulates every position's
        rows). What each role's turns contribute: the norm of their policy gradient before the
        update (`role_grad_norm`, over a minibatch of each) and its share of the roles' sum."""
        for b in batches.values():
            if b.advantages is None:
                prepare_advantages(b, self.cfg.ppo)
        one = next(iter(self.agents.values()))
        norms = {a: role_grad_norm(one.policy, b, self.cfg.ppo.mini_batch_size, self.sampling)
                 for a, b in batches.items()}
        joint = PPOBatch(**stack_rows(list(batches.values())))
        steps_of = len(batches) if self.structure.matched_steps else 1  # rows per step: k x
        stats = one.learn(joint, Turn(**stack_rows(list(turns.values()))), self.generator,
                          accumulate=steps_of)
        total = sum(norms.values()) or 1.0
        return {a: {**stats, "role_grad_norm": norms[a], "role_grad_share": norms[a] / total}
                for a in batches}


def role_grad_norm(policy, batch: PPOBatch, rows: int, sampling) -> float:
    """The norm of one role's policy gradient at the current weights (the clipped loss's
    gradient at ratio 1: -mean of A * grad log pi over its tokens), on its first `rows` rows."""
    b = batch.index(torch.arange(min(rows, len(batch))))  # copies: normal tensors, not inference
    params = [p for p in policy.trainable_parameters() if p.requires_grad]
    with torch.enable_grad():
        ev = policy.evaluate(b.input_ids, b.attention_mask, b.response_mask.shape[1],
                             sampling=sampling)
        mask = b.response_mask
        loss = -(b.advantages * ev.logprobs.float() * mask).sum() / mask.sum().clamp_min(1)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads if g is not None)))


register_method("ippo", "ppo", INDEPENDENT)
