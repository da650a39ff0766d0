"""MAPPO: two actors and one centralized critic that reads the joint transcript.

The critic sees the global state (the query, the pioneer's answer and the observer's answer
as one sequence), so its value at each token conditions on everything said so far by either
agent. GAE runs over the joint episode (pioneer tokens, then observer tokens) with the team
reward at its end; each actor is then updated with clipped PPO on its share of the advantages.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .comm import Comm
from .cory import CoryStructure
from .learner import IPPO, LearnerConfig, register_learner
from .ppo import forward_passes, gae, masked_whiten, token_rewards, value_loss


def compact(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's masked-in entries to the front; returns (values, permutation)."""
    order = torch.argsort((mask <= 0).to(torch.int8), dim=1, stable=True)
    return x.gather(1, order), order


def uncompact(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Inverse of `compact`."""
    return torch.empty_like(x).scatter_(1, order, x)


def joint_gae(rewards, values, mask, gamma, lam):
    """GAE over sequences whose valid tokens have gaps (pioneer padding, then observer tokens)."""
    r, order = compact(rewards, mask)
    v, _ = compact(values, mask)
    m, _ = compact(mask, mask)
    adv, ret = gae(r, v, m, gamma, lam)
    return uncompact(adv, order), uncompact(ret, order)


@register_learner("mappo")
class MAPPO(CoryStructure, IPPO):
    """Two PPO actors with a shared centralized critic over the joint transcript."""

    needs_critic = True

    def __init__(self, policies: dict, cfg: LearnerConfig, seed: int = 0,
                 comm: Comm | None = None, critic=None):
        super().__init__(policies, cfg, seed, comm)
        if critic is None:
            raise ValueError("MAPPO needs a critic model (an LLMPolicy whose value head is used)")
        self.critic = self.comm.prepare(critic, critic=True)
        self.critic_optimizer = self.new_critic_optimizer()

    def new_critic_optimizer(self) -> torch.optim.Adam:
        """Adam over the critic's trainable parameters."""
        return torch.optim.Adam(self.critic.trainable_parameters(), lr=self.cfg.ppo.lr)

    def agent_config(self, agent):
        """Actors carry no value loss: the centralized critic does the value learning."""
        return replace(self.cfg.ppo, vf_coef=0.0)

    def joint(self, turns):
        """(ids, mask, response mask) of [pioneer prompt | pioneer answer | observer answer]."""
        pio, obs = sorted(turns.values(), key=lambda t: t.role != "pioneer")
        T = pio.response_mask.shape[1]
        ids = torch.cat([pio.input_ids, obs.input_ids[:, -T:]], 1)
        mask = torch.cat([pio.attention_mask, obs.attention_mask[:, -T:]], 1)
        return pio, obs, ids, mask, torch.cat([pio.response_mask, obs.response_mask], 1)

    def critic_values(self, ids, mask, n):
        """Critic values at the positions that predict the last n tokens."""
        _, values, _ = self.critic(ids, mask)
        return values[:, -n - 1:-1].float()

    def update(self, turns, iteration):
        """Joint GAE with the centralized critic, then PPO per actor and a critic update."""
        home = turns  # each agent's turn on its own device; the joint part runs on the critic's
        pio, obs, ids, mask, rmask = self.joint({a: t.to(self.critic.device)
                                                 for a, t in turns.items()})
        T, cfg = pio.response_mask.shape[1], self.cfg.ppo
        with torch.no_grad():
            old_values = self.critic_values(ids, mask, 2 * T) * rmask
        per_agent = []
        for turn in (pio, obs):
            agent = self.agents[turn.agent]
            beta = agent.beta if cfg.kl_in == "reward" else 0.0
            per_agent.append(token_rewards(torch.zeros_like(turn.reward), agent.penalty(turn),
                                           turn.response_mask, beta))
        rewards = torch.cat(per_agent, 1)
        if self.reward_mode == "collective":  # the team reward, once, at the episode end
            rewards = rewards + token_rewards(obs.reward, torch.zeros_like(rmask), rmask, 0.0)
        else:
            rewards[:, :T] += token_rewards(pio.reward, torch.zeros_like(pio.response_mask),
                                            pio.response_mask, 0.0)
            rewards[:, T:] += token_rewards(obs.reward, torch.zeros_like(obs.response_mask),
                                            obs.response_mask, 0.0)
        adv, returns = joint_gae(rewards, old_values, rmask, cfg.gamma, cfg.lam)
        stats = {}
        for k, joint_turn in enumerate((pio, obs)):
            turn = home[joint_turn.agent]
            agent = self.agents[turn.agent]
            batch = agent.batch(turn)
            cols = slice(k * T, (k + 1) * T)
            a, r = adv[:, cols].to(turn.response_mask.device), returns[:, cols]
            batch.advantages = masked_whiten(a, turn.response_mask) \
                if cfg.whiten_advantages else a
            batch.returns = r.to(turn.response_mask.device)
            stats[turn.agent] = agent.learn(batch, turn, self.generator)
        critic_stats = self.update_critic(ids, mask, rmask, old_values, returns)
        for s in stats.values():
            s.update(critic_stats)
        return stats

    def update_critic(self, ids, mask, rmask, old_values, returns) -> dict:
        """Clipped value regression of the centralized critic on the joint returns."""
        cfg, B, n = self.cfg.ppo, len(ids), rmask.shape[1]
        losses = []
        for _ in range(cfg.ppo_epochs):
            for idx in torch.randperm(B, generator=self.generator).split(cfg.backward_batch_size):
                self.critic_optimizer.zero_grad(set_to_none=True)
                step_loss, finite = 0.0, True
                for part in forward_passes(idx, mask, len(idx), cfg.max_tokens_per_pass):
                    values = self.critic_values(ids[part], mask[part], n)
                    loss, _ = value_loss(values, old_values[part], returns[part], rmask[part],
                                         cfg.cliprange_value)
                    finite = self.comm.all_ok(bool(torch.isfinite(loss)))  # all ranks skip
                    if not finite:
                        break
                    self.comm.backward(loss * (len(part) / len(idx)))
                    step_loss += float(loss.detach()) * len(part) / len(idx)
                if not finite:
                    self.critic_optimizer.zero_grad(set_to_none=True)
                    continue
                if cfg.max_grad_norm:
                    torch.nn.utils.clip_grad_norm_(self.critic.trainable_parameters(),
                                                   cfg.max_grad_norm)
                self.critic_optimizer.step()
                losses.append(step_loss)
        return {"critic_value_loss": sum(losses) / max(len(losses), 1)}

    def state_dict(self):
        """Learner state plus the critic's optimizer."""
        return {**super().state_dict(), "critic_optimizer": self.critic_optimizer.state_dict()}

    def load_state_dict(self, state):
        """Restore what state_dict saved."""
        super().load_state_dict(state)
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
