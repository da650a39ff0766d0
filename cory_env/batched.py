"""The batched lockstep env that learners use: B CORY episodes, one token tensor per step.

    env = BatchedCoryEnv(task="sentiment", batch_size=64)
    obs = env.reset(seed=0)                  # the pioneer's prompts, (B, L) tensors
    while not env.finished:
        obs, rewards, terms, truncs, infos = env.step(policy(obs))   # actions: (B,) tensor

All episodes are in the same turn at the same time: first the pioneer's (env.agent_selection
is the pioneer), then the observer's (with `n_agents=K`, positions 1..K-1 in order; with
`rounds=R` the chain repeats R times, and an episode over early writes nothing more). An
episode whose agent emitted EOS ignores its actions for the rest of the turn (its obs rows
show no new tokens and obs["active"] is False). Its semantics equal the AEC env's step for
step; `tests/env/test_env_batched.py` and `tests/env/test_chain.py` check it.
"""

from __future__ import annotations

import numpy as np
import torch

from .chain import QuerySource, acting_order
from .config import EnvConfig


class BatchedCoryEnv(QuerySource):
    """B CORY episodes stepped together with (B,) token tensors (see the module docstring)."""

    def __init__(self, batch_size: int = 8, device: str | torch.device = "cpu", **config):
        if isinstance(batch_size, np.integer):
            batch_size = int(batch_size)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.config = EnvConfig.from_kwargs(**config)
        self.batch_size, self.device = batch_size, torch.device(device)
        self.episodes = self.config.episodes()
        self.task, self.tokenizer = self.episodes.task, self.episodes.tokenizer
        self.possible_agents = list(acting_order(0, self.config.n_agents))
        self._init_queries()

    @property
    def finished(self) -> bool:
        """True once the observer's turn ended and rewards are known."""
        return self.episodes.finished

    @property
    def agent_selection(self) -> str:
        """The agent whose turn it is."""
        return self.agents[self.episodes.position(self.episodes.turn)]

    @property
    def role(self) -> str:
        """The role ("pioneer", "observer", or observer_k in a chain) of the acting agent."""
        return self.episodes.roles[self.episodes.position(self.episodes.turn)]

    @property
    def turn_index(self) -> int:
        """The current turn, counted over the episode (round * K + position)."""
        return self.episodes.turn

    @property
    def round_index(self) -> int:
        """The round (0-based) of the current turn."""
        return self.episodes.turn // self.episodes.n_agents

    def reset(self, seed: int | None = None, options: dict | None = None) -> dict:
        """Start B episodes; options: "rotation" (int: llm_{(k + r) % K} at position k),
        "queries" (Query objects/indices),
        "group_size" (G: B / G queries, each answered G times in a row), "max_new_tokens"
        (n <= T: every answer of this batch stops after n tokens, a length drawn per batch)."""
        queries = self._reset_queries(seed, options, n=self.batch_size)
        if len(queries) != self.batch_size:
            g = self.group_size
            raise ValueError(f"reset: {len(queries) // g} queries x group_size {g} = "
                             f"{len(queries)} episodes, but batch_size is {self.batch_size}")
        self.episodes.start(queries, cap=self.turn_cap)
        self.agents = list(self.order())
        return self.observe()

    def observe(self, agent: str | None = None) -> dict:
        """The agent's (default: the acting agent's) ids, mask and active rows as tensors."""
        ep = self.episodes
        j = ep.turn if agent is None else ep.turn_of(self._position(agent, "observe"))
        active = ~ep.turn_done if j == ep.turn and not ep.finished else np.zeros(ep.batch, bool)
        return {"input_ids": self._tensor(ep.ids[j]),
                "attention_mask": self._tensor(ep.mask[j]).long(),
                "active": self._tensor(active), "step": ep.t}

    def step(self, actions):
        """Apply (B,) token ids of the acting agent; returns obs, rewards, terms, truncs, infos."""
        self._position(None, "step")
        tokens = np.asarray(actions.detach().cpu() if torch.is_tensor(actions) else actions)
        if tokens.shape != (self.episodes.batch,):
            raise ValueError(f"actions must have shape ({self.episodes.batch},), "
                             f"got {tuple(tokens.shape)}")
        if tokens.dtype.kind not in "iu":
            raise TypeError(f"actions must be integer token ids, got dtype {tokens.dtype}")
        self.episodes.check_tokens(tokens)
        self.episodes.step(tokens.astype(np.int64, copy=False))
        done, paid = self.episodes.finished, self.episodes.paid_now
        zeros = torch.zeros(self.episodes.batch)
        rewards = {a: zeros if paid is None else torch.tensor(paid[i], dtype=torch.float32)
                   for i, a in enumerate(self.agents)}
        terms = {a: torch.full((self.episodes.batch,), done) for a in self.agents}
        truncs = {a: torch.zeros(self.episodes.batch, dtype=torch.bool) for a in self.agents}
        return self.observe(), rewards, terms, truncs, self.infos()

    def reward(self, agent: str) -> torch.Tensor:
        """The (B,) rewards the env paid `agent` over the episodes (once they are over)."""
        if self.episodes.agent_rewards is None:
            raise RuntimeError("the episodes are not finished: no rewards yet")
        return torch.as_tensor(self.episodes.agent_rewards[self._position(agent, "reward")],
                               dtype=torch.float32)

    def infos(self) -> dict:
        """Per-agent infos: role, task reward (B,) once known, response texts once written."""
        ep, out = self.episodes, {}
        for k, agent in enumerate(self.agents):
            j = ep.turn_of(k)
            out[agent] = {
                "role": ep.roles[k],
                "task_reward": None if ep.task_rewards is None
                else torch.as_tensor(ep.task_rewards[k], dtype=torch.float32),
                "response": ep.texts[j],
                "truncated_prompt_tokens": torch.as_tensor(ep.dropped[j]),
            }
        return out

    def turn_batch(self, agent: str, number: int | None = None) -> dict:
        """The agent's latest finished turn (or turn `number` of the episode): prompt+response
        ids (B,L), mask, and response_mask (B,T)."""
        j = self.episodes.last_turn(self._position(agent, "turn")) if number is None else number
        if j is None:
            raise RuntimeError(f"{agent}'s turn is not over yet")
        ep = self.episodes
        mask = self._tensor(ep.mask[j]).long()
        return {"input_ids": self._tensor(ep.ids[j]), "attention_mask": mask,
                "response_mask": mask[:, ep.P:].float(), "queries": ep.queries,
                "query_index": torch.as_tensor(self.query_indices), "group_size": self.group_size,
                "pool_size": self.pool_size,
                "prompt_cut": torch.as_tensor(ep.dropped[j].copy())}

    def turn_rewards(self, agent: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(paid, task): (n, B) what the env paid after each of the agent's n finished turns
        and each answer's task reward (0 where its round was not scored)."""
        ep = self.episodes
        turns = ep.finished_turns(self._position(agent, "turn_rewards"))
        return (torch.as_tensor(ep.turn_paid[turns], dtype=torch.float32),
                torch.as_tensor(ep.turn_task[turns], dtype=torch.float32))

    def state(self) -> dict:
        """The joint transcript (every position's view, pioneer first) as (B, K*L) tensors."""
        ep = self.episodes
        ids = np.concatenate(list(ep.ids), axis=1)
        mask = np.concatenate(list(ep.mask), axis=1)
        return {"input_ids": self._tensor(ids), "attention_mask": self._tensor(mask).long()}

    def rng_state(self) -> dict:
        """The query sampler's RNG state (for checkpoints)."""
        return {"rng": self._rng.bit_generator.state, "rotation": self.rotation}

    def set_rng_state(self, state: dict) -> None:
        """Restore what rng_state() returned."""
        self._rng.bit_generator.state = state["rng"]
        self.rotation = int(state["rotation"])

    def _position(self, agent: str | None, what: str) -> int | None:
        """The agent's position in the current order, or a clear error (before reset / unknown)."""
        if not hasattr(self, "agents"):
            raise RuntimeError(f"reset() needs to be called before {what}")
        if agent is None:
            return None
        if agent not in self.agents:
            raise ValueError(f"unknown agent {agent!r}; agents: {self.agents}")
        return self.agents.index(agent)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(array)).to(self.device)
