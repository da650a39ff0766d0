"""MAPPO: K actors (two by default) and one centralized critic over the joint transcript.

The critic sees the global state (the query, the pioneer's answer and every later answer, in
chain order, as one gap-free sequence; with rounds, every turn of every round), so its value at
each token conditions on everything said so far by any agent. Every agent's rewards are shaped
as PPO's are (`PPOAgent.batch`: score scaling, normalisation and clipping, the per-token KL
penalty). With the collective reward, GAE runs over the joint episode (every turn's tokens in
order) with the team score once at the end of each round it pays; with individual rewards
each agent's returns run over its own turns (across rounds under `credit="episode"`) and stop
at the end of its last. Under `credit="turn"` each round (collective) or each turn
(individual) is a trajectory of its own. Each actor is then updated with clipped PPO on its
share of the advantages, and the critic regresses the returns in passes sized like the
actor's (values only: no LM head).
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import torch

from .comm import Comm
from .cory import CORY
from .learner import LearnerConfig, whiten_agents
from .ppo import gae, value_loss
from .ppo_learner import PPO
from .registry import register_learner, register_method
from .shaping import token_rewards
from .steps import clip_and_step, forward_passes, step_slices


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


def joint_sequence(pio, *later):
    """The joint transcript with its gaps moved left: (ids, mask, response mask, columns).

    ids/mask (B, L): [pioneer prompt | pioneer answer | each later answer] with every padding
    column (the one after an EOS too) moved to the left, so no value is read at a pad.
    response mask (B, K*T): each position's response columns in chain order, as in the turns.
    columns (B, K*T): the position in ids whose value predicts each response token.
    """
    T, K = pio.response_mask.shape[1], 1 + len(later)
    ids = torch.cat([pio.input_ids, *(t.input_ids[:, -T:] for t in later)], 1)
    mask = torch.cat([pio.attention_mask, *(t.attention_mask[:, -T:] for t in later)], 1)
    rmask = torch.cat([pio.response_mask, *(t.response_mask for t in later)], 1)
    order = torch.argsort((mask > 0).to(torch.int8), dim=1, stable=True)  # pads first
    where = torch.empty_like(order).scatter_(
        1, order, torch.arange(ids.shape[1], device=ids.device).expand_as(order))
    cols = (where[:, -K * T:] - 1).clamp_min(0)
    return ids.gather(1, order), mask.gather(1, order), rmask, cols


def mappo_advantages(rewards, values, rmask, collective: bool, gamma: float, lam: float,
                     n_turns: int = 2, trajectories: list[list[int]] | None = None):
    """GAE of the (B, n*T) joint rewards of n turns over `trajectories` (lists of turns, each
    one trajectory; by default the whole episode if collective, else each turn by itself)."""
    T = rmask.shape[1] // n_turns
    if trajectories is None:
        trajectories = [list(range(n_turns))] if collective else [[j] for j in range(n_turns)]
    adv, ret = torch.zeros_like(rewards), torch.zeros_like(rewards)
    for turns in trajectories:
        c = torch.cat([torch.arange(j * T, (j + 1) * T, device=rmask.device) for j in turns])
        adv[:, c], ret[:, c] = joint_gae(rewards[:, c], values[:, c], rmask[:, c], gamma, lam)
    return adv, ret


def episode_order(chain) -> list[tuple[object, slice]]:
    """Every turn of the episode in order, as (the agent's Turn, its rows): round r's
    positions 0..K-1 are rows block r of each agent's stacked turns."""
    B = chain[0].response_mask.shape[0] // chain[0].rounds
    out = []
    for r in range(max(t.rounds for t in chain)):
        out += [(t, slice(r * B, (r + 1) * B)) for t in chain if r < t.rounds]
    return out


def view(turn, rows: slice) -> SimpleNamespace:
    """The rows of one turn, as `joint_sequence` reads them."""
    return SimpleNamespace(input_ids=turn.input_ids[rows], attention_mask=turn.attention_mask[rows],
                           response_mask=turn.response_mask[rows])


@register_learner("mappo")
class MAPPO(PPO):
    """K PPO actors with a shared centralized critic over the joint transcript."""

    extra_model_names = ("critic",)
    joint_reader = ("critic",)
    min_agents = 2  # a centralized critic over a chain: no single-agent method

    def __init__(self, policies: dict, cfg: LearnerConfig, seed: int = 0,
                 comm: Comm | None = None, critic=None, **kwargs):
        super().__init__(policies, cfg, seed, comm, **kwargs)
        if critic is None:
            raise ValueError("MAPPO needs a critic model (an LLMPolicy whose value head is used)")
        self.critic = self.comm.prepare(critic, critic=True)
        self.critic_optimizer = self.new_critic_optimizer()

    def extra_optimizers(self) -> list:
        """The critic's optimizer."""
        return [self.critic_optimizer]

    def new_critic_optimizer(self) -> torch.optim.Adam:
        """Adam over the critic's trainable parameters."""
        return torch.optim.Adam(self.critic.trainable_parameters(), lr=self.cfg.ppo.lr)

    def agent_config(self, agent):
        """Actors carry no value loss: the centralized critic does the value learning."""
        return replace(super().agent_config(agent), vf_coef=0.0)

    def critic_values(self, ids, mask, cols):
        """Critic values (B, K*T) at the positions that predict each response token."""
        return self.critic.values(ids, mask).gather(1, cols).float()

    def passes(self, rows, mask):
        """Row groups of one critic pass: mini_batch_size rows, within max_tokens_per_pass."""
        cfg = self.cfg.ppo
        return forward_passes(rows, mask, cfg.mini_batch_size, cfg.max_tokens_per_pass)

    def update(self, turns, iteration):
        """Shaped rewards per agent, GAE with the centralized critic, PPO per actor, the critic."""
        cfg, dev = self.cfg.ppo, self.critic.device
        batches = {a: self.agents[a].batch(t) for a, t in turns.items()}
        chain = sorted(turns.values(), key=lambda t: t.position)
        order = episode_order(chain)  # every turn, in the episode's order
        ids, mask, rmask, cols = joint_sequence(*(view(t.to(dev), r) for t, r in order))
        old_values = torch.zeros_like(rmask)
        with torch.no_grad():
            for p in self.passes(torch.arange(len(ids)), mask):
                old_values[p] = self.critic_values(ids[p], mask[p], cols[p])
        old_values = old_values * rmask
        T, K, n, stats = chain[0].response_mask.shape[1], len(chain), len(order), {}
        spans = [slice(j * T, (j + 1) * T) for j in range(n)]
        collective = self.structure.reward_mode == "collective"
        rewards = [batches[t.agent].rewards[r].to(dev) for t, r in order]
        if collective:  # the team score counts once a round, at its last turn
            for j, (t, r) in enumerate(order):
                if j % K != K - 1 and j != n - 1:
                    rewards[j] = rewards[j] - token_rewards(
                        batches[t.agent].scores[r].to(dev), torch.zeros_like(rewards[j]),
                        rmask[:, spans[j]], 0.0)
        across = cfg.credit == "episode"
        if collective:  # the whole episode, or each round
            trajectories = [list(range(n))] if across else \
                [list(range(r, min(r + K, n))) for r in range(0, n, K)]
        else:  # each agent's turns, or each turn
            trajectories = [list(range(k, n, K)) for k in range(K)] if across else \
                [[j] for j in range(n)]
        adv, returns = mappo_advantages(torch.cat(rewards, 1), old_values, rmask, collective,
                                        cfg.gamma, cfg.lam, n, trajectories)
        mine = {t.agent: torch.cat([torch.arange(j * T, (j + 1) * T, device=dev)
                                    for j in range(n) if order[j][0] is t]) for t in chain}
        if cfg.whiten_advantages:  # per agent (per_agent_norm), or over every agent's tokens
            white = whiten_agents({a: adv[:, c] for a, c in mine.items()},
                                  {a: rmask[:, c] for a, c in mine.items()},
                                  self.cfg.per_agent_norm)
            for a, c in mine.items():
                adv[:, c] = white[a]
        for turn in chain:  # the agent's turns back in its round-major rows
            batch, home, rows = batches[turn.agent], turn.response_mask.device, turn.rounds
            blocks = mine[turn.agent].view(rows, T)
            batch.advantages = torch.cat([adv[:, c] for c in blocks]).to(home)
            batch.returns = torch.cat([returns[:, c] for c in blocks]).to(home)
            stats[turn.agent] = self.agents[turn.agent].learn(batch, turn, self.generator)
        critic_stats = self.update_critic(ids, mask, rmask, cols, old_values, returns)
        for s in stats.values():
            s.update(critic_stats)
        return stats

    def update_critic(self, ids, mask, rmask, cols, old_values, returns) -> dict:
        """Clipped value regression of the centralized critic on the joint returns."""
        cfg, B = self.cfg.ppo, len(ids)
        params = self.critic.trainable_parameters()
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm else math.inf
        losses, skipped = [], 0
        for _ in range(cfg.ppo_epochs):
            for _, idx in step_slices(B, cfg.backward_batch_size, self.generator):
                self.critic_optimizer.zero_grad(set_to_none=True)
                step_loss, reason = 0.0, None
                for part in self.passes(idx, mask):
                    values = self.critic_values(ids[part], mask[part], cols[part])
                    loss, _ = value_loss(values, old_values[part], returns[part], rmask[part],
                                         cfg.cliprange_value)
                    if not self.comm.all_ok(bool(torch.isfinite(loss))):  # all ranks skip
                        reason = f"non-finite critic loss {float(loss)}"
                        break
                    self.comm.backward(loss * (len(part) / len(idx)))
                    step_loss += float(loss.detach()) * len(part) / len(idx)
                if clip_and_step(self.critic_optimizer, params, max_norm, reason,
                                 self.comm.all_ok, "MAPPO: skipping a critic step") is None:
                    skipped += 1
                    continue
                losses.append(step_loss)
        return {"critic_value_loss": sum(losses) / len(losses) if losses else float("nan"),
                "critic_skipped_batches": float(skipped)}

    def state_dict(self):
        """Learner state plus the critic's optimizer."""
        return {**super().state_dict(), "critic_optimizer": self.critic_optimizer.state_dict()}

    def load_state_dict(self, state):
        """Restore what state_dict saved."""
        super().load_state_dict(state)
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])


register_method("cory-mappo", "mappo", CORY)  # mappo on CORY's structure
