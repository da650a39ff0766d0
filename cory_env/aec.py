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
from collections.abc import Mapping

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils import wrappers
from pettingzoo.utils.conversions import turn_based_aec_to_parallel
from pettingzoo.utils.env_logger import EnvLogger

from .config import SWAP_ROLES_GONE, EnvConfig, check_rotation
from .core import PIONEER
from .tasks.base import Query

AGENTS = ("llm_0", "llm_1")
RESET_OPTIONS = ("rotation", "queries", "group_size", "max_new_tokens")
GONE_OPTIONS = {"swap_roles": SWAP_ROLES_GONE, "order": SWAP_ROLES_GONE}  # refused by name


def agent_names(n_agents: int) -> tuple[str, ...]:
    """The agents of a K-agent env: llm_0 .. llm_{K-1}."""
    return tuple(f"llm_{i}" for i in range(n_agents))


def env(**config):
    """The AEC env with PettingZoo's order-enforcing wrapper (bounds are checked by raw_env)."""
    return wrappers.OrderEnforcingWrapper(raw_env(**config))


def parallel_env(**config):
    """The parallel API via `turn_based_aec_to_parallel`: only the acting agent's action is used."""
    return turn_based_aec_to_parallel(raw_env(**config))


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


def role_order(rotation: int = 0, n_agents: int = 2) -> tuple[str, ...]:
    """Agent names in acting order (pioneer first): position k is llm_{(k + rotation) % K}."""
    if n_agents == 1:
        return AGENTS[:1]
    names = agent_names(n_agents)
    r = int(rotation) % n_agents
    return names[r:] + names[:r]


def parse_reset_options(options, warned: set) -> dict:
    """Validate known reset options; warn once about unknown keys."""
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(f"reset options must be a dict or None, got {options!r}")
    options = dict(options or {})
    for name in sorted(set(options) & set(GONE_OPTIONS)):
        raise ValueError(f"reset option {name!r} is gone: {GONE_OPTIONS[name]}")
    unknown = sorted(set(options) - set(RESET_OPTIONS))
    if unknown and tuple(unknown) not in warned:
        warned.add(tuple(unknown))
        warnings.warn(f"ignoring unknown reset options {unknown}; known: {list(RESET_OPTIONS)}",
                      stacklevel=3)
    if "rotation" in options:
        r = options["rotation"]
        if isinstance(r, (bool, np.bool_)) or not isinstance(r, numbers.Integral):
            raise ValueError(f"reset option rotation must be an integer, got {r!r}")
    if "queries" in options and not isinstance(options["queries"], (list, tuple)):
        raise TypeError(f"queries must be a list of Query or int, got {options['queries']!r}")
    if "queries" in options and not options["queries"]:
        raise ValueError("queries is empty: give at least one Query or index")
    if "group_size" in options:
        g = options["group_size"]
        if isinstance(g, (bool, np.bool_)) or not isinstance(g, numbers.Integral) or g < 1:
            raise ValueError(f"group_size must be a positive integer, got {g!r}")
    if "max_new_tokens" in options:
        n = options["max_new_tokens"]
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"reset option max_new_tokens must be a positive integer, got {n!r}")
    return {k: options[k] for k in RESET_OPTIONS if k in options}


def resolve_queries(items, pool: list[Query]) -> list[Query]:
    """Turn a list of Query objects or indices into the split's queries."""
    out = []
    for item in items:
        if isinstance(item, Query):
            out.append(item)
        elif isinstance(item, numbers.Integral) and not isinstance(item, (bool, np.bool_)) \
                and 0 <= item < len(pool):
            out.append(pool[int(item)])
        else:
            raise ValueError(f"query {item!r} is not a Query or an index below {len(pool)}")
    return out


def _position(query: Query, pool: list[Query]) -> int:
    """The query's index in the pool (by identity, then equality), or -1."""
    for i, q in enumerate(pool):
        if q is query:
            return i
    return next((i for i, q in enumerate(pool) if q == query), -1)


class QuerySource:
    """Seeded query sampling and reset options, shared by the AEC and the batched env."""

    def _init_queries(self) -> None:
        self._rng = np.random.default_rng(self.config.seed)
        self._warned: set = set()
        cfg = self.config
        self.rotation = check_rotation(cfg.rotation, cfg.n_agents)

    @property
    def prompt_len(self) -> int:
        """P: prompts are right-aligned in columns [0, P)."""
        return self.episodes.P

    @property
    def max_new_tokens(self) -> int:
        """T: the most tokens an agent may write in its turn."""
        return self.episodes.T

    def order(self) -> tuple[str, ...]:
        """The agents in acting order: the rotation's."""
        return role_order(self.rotation, self.config.n_agents)

    def _reset_queries(self, seed, options, n: int, limit: int | None = None) -> list[Query]:
        """Apply reset(seed, options) and return the n queries of the new episodes.

        With "group_size" G the n episodes are n / G queries, each repeated G times in a row
        (a group); `query_indices` (positions in the pool, -1 for a Query given that is not
        in it), `group_size` and `pool_size` say what was drawn.
        """
        opts = parse_reset_options(options, self._warned)
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
                raise TypeError(f"reset(seed=...) must be a non-negative integer or None, got "
                                f"{seed!r}")
            self._rng = np.random.default_rng(seed)
        if "rotation" in opts:
            self.rotation = check_rotation(opts["rotation"], self.config.n_agents)
        group = int(opts.get("group_size", 1))
        if n % group:
            raise ValueError(f"group_size={group} must divide the number of episodes ({n})")
        pool = self.task.queries(self.config.split)
        if "queries" in opts:
            items = list(opts["queries"][:limit])
            queries = resolve_queries(items, pool)
            index = [int(i) if isinstance(i, numbers.Integral) else _position(q, pool)
                     for i, q in zip(items, queries)]
        else:
            index = [int(i) for i in self._rng.integers(len(pool), size=n // group)]
            queries = [pool[i] for i in index]
        self.turn_cap = opts.get("max_new_tokens")  # this reset's answer length (None: T)
        self.query_indices = np.repeat(np.asarray(index, dtype=np.int64), group)
        self.group_size, self.pool_size = group, len(pool)
        return [q for q in queries for _ in range(group)]


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
        self.possible_agents = list(role_order(0, self.config.n_agents))
        vocab, context, slots = self.episodes.vocab, self.episodes.L, max(self.episodes.n_turns, 2)
        self._obs_space = observation_space(context, vocab, self.config.action_mask)
        self._act_space = spaces.Discrete(vocab)
        self._mask = np.ones(vocab, dtype=np.int8) if self.config.action_mask else None
        self.state_space = spaces.Dict({
            "input_ids": spaces.Box(0, vocab - 1, (slots * context,), np.int64),
            "attention_mask": spaces.Box(0, 1, (slots * context,), np.int8),
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
        self._slot = {agent: slot for slot, agent in enumerate(order)}
        self.agents = list(order)
        self.agent_selection = order[PIONEER]
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: self._info(a) for a in self.agents}

    def _info(self, agent) -> dict:
        slot = self._slot[agent]
        return {"role": self.episodes.roles[slot], "task_reward": None, "response": None,
                "truncated_prompt_tokens": int(self.episodes.dropped[slot, 0])}

    def observe(self, agent):
        """The agent's prompt and its tokens so far in its current or latest turn (all padding
        before its first turn starts)."""
        row = self.episodes.row(self._slot_of(agent))
        obs = {"observation": {"input_ids": self.episodes.ids[row, 0].copy(),
                               "attention_mask": self.episodes.mask[row, 0].copy()}}
        if self._mask is not None:
            obs["action_mask"] = self._mask
        return obs

    def _slot_of(self, agent) -> int:
        if not hasattr(self, "_slot"):
            EnvLogger.error_observe_before_reset()
        if agent not in self._slot:
            raise ValueError(f"unknown agent {agent!r}; agents: {list(self._slot)}")
        return self._slot[agent]

    def prompt_ids(self, agent) -> np.ndarray:
        """The agent's prompt token ids in its current or latest turn (its rendered template;
        empty before its turn)."""
        return self.episodes.prompt_ids(self.episodes.row(self._slot_of(agent)))

    def answer_ids(self, agent) -> np.ndarray:
        """The agent's answer token ids so far in its current or latest turn (EOS included when
        it ended the answer)."""
        return self.episodes.answer_ids(self.episodes.row(self._slot_of(agent)))

    @property
    def answer_cap(self) -> int:
        """The most tokens an answer may have in this episode (max_new_tokens, or the reset's)."""
        return self.episodes.cap

    def state(self):
        """The joint transcript: every position's view in acting order (pioneer first)."""
        if not hasattr(self, "_slot"):
            EnvLogger.error_state_before_reset()
        return {"input_ids": self.episodes.ids[:, 0].reshape(-1).copy(),
                "attention_mask": self.episodes.mask[:, 0].reshape(-1).copy()}

    def step(self, action):
        """Append the selected agent's token; end its turn on EOS or max_new_tokens."""
        if not hasattr(self, "_slot"):
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
            self.rewards[agent] = float(paid[self._slot[agent], 0])

    def _finish(self) -> None:
        ep, cap = self.episodes, self.config.max_cycles
        capped = ep.truncated or cap is not None and not ep.hit_eos[ep.turn, 0]
        self._pay(ep.paid_now)
        for agent in self.agents:
            slot = self._slot[agent]
            self.infos[agent]["task_reward"] = float(ep.task_rewards[slot, 0])
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
        if not self.agents and not hasattr(self, "_slot"):
            return "(no episode)"
        ep = self.episodes
        lines = [f"query: {ep.queries[0].text!r}"]
        agents = {slot: agent for agent, slot in self._slot.items()}
        played = range(ep.turn + 1) if ep.rounds > 1 else range(len(agents))
        for turn in played:
            slot = ep.position(turn)
            prompt = self.tokenizer.decode(ep.prompt_ids(turn).tolist())
            response = self.tokenizer.decode(ep.answer_ids(turn).tolist())
            said = f" round {turn // ep.n_agents + 1}" if ep.rounds > 1 else ""
            line = f"[{agents[slot]} {ep.roles[slot]}{said}] {prompt!r} -> {response!r}"
            if turn < ep.scored:
                line += f"  r={ep.turn_task[turn, 0]:+.3f}"
            lines.append(line)
        return "\n".join(lines)

    def close(self):
        """Nothing to release."""
