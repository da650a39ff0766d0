"""The CORY AEC env: the pioneer writes its answer token by token, then the observer does.

| Import             | `cory_env.env(task="sentiment")` (`parallel_env` for the parallel API) |
|--------------------|------------------------------------------------------------------------|
| Version            | `cory_v0` (`metadata["name"]`)                                         |
| Agents             | `llm_0 .. llm_{K-1}`, K = `n_agents` (2)                               |
| Actions            | `Discrete(vocab)`: one token id per step; `None` once done             |
| Observations       | `{"observation": {"input_ids", "attention_mask"}}`, each `(context_len,)`: |
|                    | the left-padded prompt and the answer so far (+ `"action_mask"`)       |
| State              | every position's observation, concatenated (`state()`)                 |
| Rewards            | 0 until the last position's turn ends; then every agent gets the sum of  |
|                    | the K task rewards (`reward_mode="collective"`) or its own ("individual") |
|                    | (with `rounds`: at the end of each round the task pays)                  |
| Infos              | `role`, `task_reward`, `response`, and any prompt tokens cut           |

    env = cory_env.env(task="sentiment", max_new_tokens=8)
    env.reset(seed=0)
    for agent in env.agent_iter():
        obs, reward, term, trunc, info = env.last()
        env.step(None if term or trunc else env.action_space(agent).sample())

**Arguments** (`cory_env.config.EnvConfig`, checked by name): `task`, `tokenizer`,
`max_new_tokens` and `context_len` (None: the task's), `n_agents`, `rounds`, `rotation`,
`knowledge_transfer`, `reward_mode`, `render_mode`, `seed`, `split`,
`action_mask`, `max_cycles`. Reset options: `rotation`, `queries`, `group_size`,
`max_new_tokens`.

Agents are `llm_0` and `llm_1`. With `rotation=0` llm_0 is the pioneer; `rotation=1` (or
`reset(options={"rotation": 1})`) makes llm_1 act first. That is CORY's role exchange.
Both agents terminate together at the end of the observer's turn, when they receive the
collective reward r_pio + r_obs (or their own reward under reward_mode="individual").

A chain of K agents (`n_agents=K`: `llm_0 .. llm_{K-1}`, roles pioneer, observer_1 ..
observer_{K-1}): the agent at position k sees the query and the answers of positions 0..k-1
(each task's `chain_template`), all K are paid the sum of the K task rewards (or their own),
and `rotation=r` (a config field or reset option) puts llm_{(k + r) mod K} at position k.
Prompts grow with K: an unset context_len is
fitted to the longest prompt, a given one that is too short is warned about.

One agent acting alone (the single-agent baseline) is `n_agents=1`: only llm_0 acts.

Rounds (`rounds=R`, default 1): the chain repeats R times, every agent speaking once a round.
A later turn's prompt is the task's `round_template` (by default the query and the whole
transcript so far); a round's answers are scored when it ends, and the task pays every round
or only the last (`Task.round_rewards`), each payment to every agent's latest turn, reported as
that step's reward. A task may end an episode early (`Task.game_over`: a game won), and
`max_cycles` caps each agent's steps over the whole episode. docs/environment.md, "Rounds".

Version history: `cory_v0`, the first (role order is the one option `rotation` and one agent
is `n_agents=1`; the earlier `swap_roles`, `order` and `single_agent` are refused by name;
`rounds` added, with R = 1 the env as before).
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils import wrappers
from pettingzoo.utils.conversions import turn_based_aec_to_parallel_wrapper
from pettingzoo.utils.env_logger import EnvLogger

from .chain import QuerySource, acting_order
from .config import EnvConfig
from .core import PIONEER


def env(**config):
    """The AEC env with PettingZoo's order-enforcing wrapper (bounds are checked by raw_env)."""
    return wrappers.OrderEnforcingWrapper(raw_env(**config))


def parallel_env(**config):
    """The parallel API (PettingZoo's turn-based conversion): only the acting agent's action is
    used, and a step without it is refused by name."""
    return ParallelCoryEnv(raw_env(**config))


class ParallelCoryEnv(turn_based_aec_to_parallel_wrapper):
    """`parallel_env`'s class: the turn-based parallel view, whose `step` names the acting
    agent when the actions lack it (the others' actions are ignored, as PettingZoo's are)."""

    def step(self, actions):
        """Apply the acting agent's action (`actions[agent]`); the others' are ignored."""
        acting = self.aec_env.agent_selection if self.aec_env.agents else None
        if acting is not None and (not isinstance(actions, dict) or acting not in actions):
            given = sorted(actions) if isinstance(actions, dict) else actions
            raise ValueError(f"step: {acting!r} acts now (turn-based: only the acting agent's "
                             f"action is applied), but the actions hold {given!r}; give "
                             f"{{{acting!r}: token}}")
        return super().step(actions)


def observation_space(length: int, vocab: int, action_mask: bool) -> spaces.Dict:
    """The observation space: token ids and attention mask nested under "observation"."""
    inner = spaces.Dict({
        "input_ids": spaces.Box(0, vocab - 1, (length,), np.int64),
        "attention_mask": spaces.Box(0, 1, (length,), np.int8),
    })
    outer = {"observation": inner}
    if action_mask:
        outer["action_mask"] = spaces.Box(0, 1, (vocab,), np.int8)
    return spaces.Dict(outer)


def as_token(action) -> int:
    """Return an action as an int token id, or raise TypeError for non-integers."""
    if isinstance(action, (bool, np.bool_)) or not isinstance(action, numbers.Integral):
        if isinstance(action, np.ndarray) and action.shape == () and action.dtype.kind in "iu":
            return int(action)
        raise TypeError(f"action must be an integer token id, got {action!r} "
                        f"({type(action).__name__})")
    return int(action)


class raw_env(QuerySource, AECEnv):
    """CORY's sequential K-LLM token-level env (K = 2 by default; see the module docstring)."""

    metadata = {"name": "cory_v0", "render_modes": ["human", "ansi"], "is_parallelizable": True}

    def __init__(self, **config):
        self.config = EnvConfig.from_kwargs(**config)
        self.render_mode = self.config.render_mode
        self.episodes = self.config.episodes()
        self.task, self.tokenizer = self.episodes.task, self.episodes.tokenizer
        self.possible_agents = list(acting_order(0, self.config.n_agents))
        vocab, context = self.episodes.vocab, self.episodes.L
        windows = max(self.episodes.n_turns, 2)
        self._obs_space = observation_space(context, vocab, self.config.action_mask)
        self._act_space = spaces.Discrete(vocab)
        self._mask = np.ones(vocab, dtype=np.int8) if self.config.action_mask else None
        self.state_space = spaces.Dict({
            "input_ids": spaces.Box(0, vocab - 1, (windows * context,), np.int64),
            "attention_mask": spaces.Box(0, 1, (windows * context,), np.int8),
        })
        self._init_queries()
        self.agents: list[str] = []

    # -- spaces ------------------------------------------------------------------------------
    def observation_space(self, agent):
        """The (cached) observation space of an agent."""
        return self._obs_space

    def action_space(self, agent):
        """The (cached) Discrete(vocab) action space of an agent."""
        return self._act_space

    # -- episode -----------------------------------------------------------------------------
    def reset(self, seed=None, options=None):
        """Start an episode on a sampled query (or `options["queries"][0]`)."""
        self.episodes.start(self._reset_queries(seed, options, n=1, limit=1), cap=self.turn_cap)
        order = self.order()
        self._position = {agent: k for k, agent in enumerate(order)}
        self.agents = list(order)
        self.agent_selection = order[PIONEER]
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: self._info(a) for a in self.agents}

    def _info(self, agent) -> dict:
        k = self._position[agent]
        return {"role": self.episodes.roles[k], "task_reward": None, "response": None,
                "truncated_prompt_tokens": int(self.episodes.dropped[k, 0])}

    def observe(self, agent):
        """The agent's prompt and its tokens so far in its current or latest turn (all padding
        before its first turn starts)."""
        j = self.episodes.turn_of(self._position_of(agent))
        obs = {"observation": {"input_ids": self.episodes.ids[j, 0].copy(),
                               "attention_mask": self.episodes.mask[j, 0].copy()}}
        if self._mask is not None:
            obs["action_mask"] = self._mask
        return obs

    def _position_of(self, agent) -> int:
        if not hasattr(self, "_position"):
            EnvLogger.error_observe_before_reset()
        if agent not in self._position:
            raise ValueError(f"unknown agent {agent!r}; agents: {list(self._position)}")
        return self._position[agent]

    def prompt_ids(self, agent) -> np.ndarray:
        """The agent's prompt token ids in its current or latest turn (its rendered template;
        empty before its turn)."""
        return self.episodes.prompt_ids(self.episodes.turn_of(self._position_of(agent)))

    def answer_ids(self, agent) -> np.ndarray:
        """The agent's answer token ids so far in its current or latest turn (EOS included when
        it ended the answer)."""
        return self.episodes.answer_ids(self.episodes.turn_of(self._position_of(agent)))

    @property
    def answer_cap(self) -> int:
        """The most tokens an answer may have in this episode (max_new_tokens, or the reset's)."""
        return self.episodes.cap

    def state(self):
        """The joint transcript: every position's view in acting order (pioneer first)."""
        if not hasattr(self, "_position"):
            EnvLogger.error_state_before_reset()
        return {"input_ids": self.episodes.ids[:, 0].reshape(-1).copy(),
                "attention_mask": self.episodes.mask[:, 0].reshape(-1).copy()}

    def step(self, action):
        """Append the selected agent's token; end its turn on EOS or max_new_tokens."""
        if not hasattr(self, "_position"):
            EnvLogger.error_step_before_reset()  # PettingZoo's own message
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        token = np.array([as_token(action)])
        self.episodes.check_tokens(token)
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        ep, turn = self.episodes, self.episodes.turn
        if ep.step(token):
            self.infos[agent]["response"] = ep.texts[turn][0]
            if ep.finished:
                self._finish()
            else:
                nxt = ep.turn
                self.agent_selection = self.agents[ep.position(nxt)]
                self.infos[self.agent_selection]["truncated_prompt_tokens"] = \
                    int(ep.dropped[nxt, 0])
                if ep.paid_now is not None:  # a round ended and the task pays every round
                    self._pay(ep.paid_now)
        self._accumulate_rewards()

    def _pay(self, paid: np.ndarray) -> None:
        """This step's rewards: each agent's share of what the round paid."""
        for agent in self.agents:
            self.rewards[agent] = float(paid[self._position[agent], 0])

    def _finish(self) -> None:
        ep, cap = self.episodes, self.config.max_cycles
        capped = ep.truncated or cap is not None and not ep.hit_eos[ep.turn, 0]
        self._pay(ep.paid_now)
        for agent in self.agents:
            k = self._position[agent]
            self.infos[agent]["task_reward"] = float(ep.task_rewards[k, 0])
            if capped:  # the episode ran into max_cycles: truncated, as PettingZoo says
                self.truncations[agent] = True
            else:
                self.terminations[agent] = True
        self.agent_selection = self.agents[PIONEER]

    # -- rendering ---------------------------------------------------------------------------
    def render(self):
        """"ansi" returns the transcript, "human" prints it, None warns."""
        if self.render_mode is None:
            warnings.warn("render() called without a render_mode", stacklevel=2)
            return None
        text = self.transcript()
        if self.render_mode == "ansi":
            return text
        print(text)
        return None

    def transcript(self) -> str:
        """A readable transcript of the current episode."""
        if not self.agents and not hasattr(self, "_position"):
            return "(no episode)"
        ep = self.episodes
        lines = [f"query: {ep.queries[0].text!r}"]
        agents = {k: agent for agent, k in self._position.items()}
        played = range(ep.turn + 1) if ep.rounds > 1 else range(len(agents))
        for turn in played:
            k = ep.position(turn)
            prompt = self.tokenizer.decode(ep.prompt_ids(turn).tolist())
            response = self.tokenizer.decode(ep.answer_ids(turn).tolist())
            said = f" round {turn // ep.n_agents + 1}" if ep.rounds > 1 else ""
            line = f"[{agents[k]} {ep.roles[k]}{said}] {prompt!r} -> {response!r}"
            if turn < ep.scored:
                line += f"  r={ep.turn_task[turn, 0]:+.3f}"
            lines.append(line)
        return "\n".join(lines)

    def close(self):
        """Nothing to release."""
