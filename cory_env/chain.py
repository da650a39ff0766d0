"""The chain's agents, their order and the queries of each reset: what the token env
(`cory_env.aec`) and the batched env (`cory_env.batched`) share.

Agents are llm_0 .. llm_{K-1}; `rotation` r puts llm_{(k + r) mod K} at position k (CORY's
role exchange for K = 2). The rotation is checked and reduced mod K once, where it enters (a
config field or a reset option: `check_rotation`), and read as `env.rotation` afterwards.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from .config import SWAP_ROLES_GONE, check_rotation
from .tasks.base import Query

AGENTS = ("llm_0", "llm_1")
RESET_OPTIONS = ("rotation", "queries", "group_size", "max_new_tokens")
GONE_OPTIONS = {"swap_roles": SWAP_ROLES_GONE, "order": SWAP_ROLES_GONE}  # refused by name


def agent_names(n_agents: int) -> tuple[str, ...]:
    """The agents of a K-agent env: llm_0 .. llm_{K-1}."""
    return tuple(f"llm_{i}" for i in range(n_agents))


def acting_order(rotation: int = 0, n_agents: int = 2) -> tuple[str, ...]:
    """Agent names in acting order (pioneer first): position k is llm_{(k + rotation) % K}."""
    if n_agents == 1:
        return AGENTS[:1]
    names, r = agent_names(n_agents), check_rotation(rotation, n_agents)
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
        return acting_order(self.rotation, self.config.n_agents)

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
            self.rotation = check_rotation(opts["rotation"], self.config.n_agents, "reset option "
                                                                                   "rotation")
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


def copy_rate(earlier: Sequence[str], later: Sequence[str]) -> float:
    """Share of episodes whose later answer equals the earlier one verbatim (after strip)."""
    if len(earlier) != len(later):
        raise ValueError(f"texts are not aligned: {len(earlier)} earlier vs {len(later)} later")
    if not earlier:
        return float("nan")
    return sum(a.strip() == b.strip() for a, b in zip(earlier, later)) / len(earlier)
