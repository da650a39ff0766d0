"""The Task interface: queries, pioneer/observer templates and a batched reward.

A task never sees a policy. It turns a query (and, for the observer, the pioneer's response
tokens) into prompt token ids, and scores finished responses.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import re
import types
import typing
import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cory_common.plugins import check_not_builtin, load_entry_points

QUERY, RESPONSE, STATE = "{query}", "{response}", "{state}"
_PLACEHOLDER = re.compile(r"(\{query\}|\{state\}|\{response(?:_\d+)?\})")
ROUND_REWARDS = ("final", "each")


def response_slot(position: int) -> str:
    """The placeholder of the answer given at chain position `position` (1 = the pioneer's)."""
    return f"{{response_{position}}}"


def slot_position(piece: str, previous: int) -> int | None:
    """The 1-based chain position a response placeholder refers to (`{response}`: the
    latest, `previous`), or None for any other piece."""
    if piece == RESPONSE:
        return previous
    found = re.fullmatch(r"\{response_(\d+)\}", piece)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Query:
    """One prompt of a task: its text, optional exact token ids and optional ground truth."""

    text: str
    answer: str | None = None
    ids: tuple[int, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Template:
    """A prompt template split into static strings and `{query}` / `{response}` slots.

    Static pieces are tokenized once; the query and the responses are inserted as token ids,
    so earlier agents' tokens appear in a later agent's prompt exactly as generated.
    `{response}` is the previous agent's answer; in a chain of K agents `{response_j}` is the
    answer of turn j (1 = the pioneer's first; with rounds, turns count on across rounds).
    `{state}` is text the task writes for the turn from the transcript so far (`state_text`:
    a game's board), tokenized per episode.
    """

    text: str

    def pieces(self) -> list[str]:
        """The template as alternating static strings and placeholders (empty strings dropped)."""
        return [p for p in _PLACEHOLDER.split(self.text) if p]

    def uses(self, slot: str) -> bool:
        """Whether the template contains the given placeholder."""
        return slot in self.text


class Task(ABC):
    """A CORY task: where queries come from, how prompts look, and how responses are scored.

    Subclasses set `name`, `pioneer_template` and `observer_template`, and implement
    `load_queries`, `reward` and `build_tokenizer` (docs/environment.md, "Writing a task"). In
    a chain of K > 2 agents, position k >= 2 uses `chain_template(k)`.
    """

    name: str = "task"
    pioneer_template: str = QUERY
    observer_template: str = QUERY + RESPONSE
    #: what the observer sees when knowledge transfer is off (the paper's ablation)
    observer_template_no_kt: str | None = None
    default_max_new_tokens: int = 16
    default_context_len: int = 128
    #: True: the task speaks the run's tokenizer (the model's, or the env's `tokenizer=`), and
    #: its own `build_tokenizer` is only the default when a run brings none
    takes_run_tokenizer: bool = False
    #: True: a reward of 1 means solved and 0 not (pass@k, greedy accuracy and the math
    #: claims apply)
    exact_match: bool = False
    #: the name of the offline reference LM built on this task's corpus and tokenizer
    #: ("sentiment" or "arithmetic"): the model of a run that names none; None: a run must
    #: bring a model
    offline_model: str | None = None
    #: with rounds > 1: "final" pays the last round's task rewards at the end, "each" pays
    #: every round's at the end of that round
    round_rewards: str = "final"
    #: True: the agents' task rewards always sum to 0 (a two-player game), so the collective
    #: reward pays nothing
    zero_sum: bool = False

    def __init__(self) -> None:
        self._tokenizer = None
        self._queries: dict[str, list[Query]] = {}

    # -- data -------------------------------------------------------------------------------
    @abstractmethod
    def load_queries(self, split: str) -> list[Query]:
        """Return every query of a split ("train" or "test")."""

    def queries(self, split: str = "train") -> list[Query]:
        """The split's queries, loaded once and cached."""
        if split not in self._queries:
            qs = self.load_queries(split)
            if not qs:
                raise ValueError(f"task {self.name!r} has no queries in split {split!r}")
            self._queries[split] = qs
        return self._queries[split]

    # -- tokens -----------------------------------------------------------------------------
    @abstractmethod
    def build_tokenizer(self):
        """Return the task's default HF tokenizer."""

    @property
    def tokenizer(self):
        """The task's default tokenizer (built on first use)."""
        if self._tokenizer is None:
            self._tokenizer = self.build_tokenizer()
        return self._tokenizer

    def use_tokenizer(self, tokenizer) -> None:
        """Adopt the run's tokenizer (a `takes_run_tokenizer` task's queries follow it)."""
        if tokenizer is not self._tokenizer:
            self._tokenizer = tokenizer
            self._queries.clear()

    def query_ids(self, query: Query, tokenizer) -> list[int]:
        """Token ids of a query: its stored ids if any, else the tokenized text."""
        if query.ids is not None and tokenizer is self.tokenizer:
            return list(query.ids)
        return tokenizer.encode(query.text, add_special_tokens=False)

    def query_lengths(self, queries: Sequence[Query], tokenizer) -> list[int]:
        """len(query_ids(q)) of every query, the texts tokenized in one batched call."""
        own = tokenizer is self.tokenizer
        texts = [q.text for q in queries if not (own and q.ids is not None)]
        encoded = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
        return [len(q.ids) if own and q.ids is not None else len(next(encoded)) for q in queries]

    # -- reward -----------------------------------------------------------------------------
    @abstractmethod
    def reward(self, queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
        """Score each response to its query; returns a float array of shape (len(queries),)."""

    def chain_template(self, position: int) -> str:
        """The prompt of chain position `position` >= 2 (0-based): the observer template with
        the answers of positions 1..position listed, one per line, where it has `{response}`."""
        listed = "\n".join(response_slot(j) for j in range(1, position + 1))
        return self.observer_template.replace(RESPONSE, listed)

    def round_template(self, turn: int, n_agents: int, knowledge_transfer: bool) -> str:
        """The prompt of turn `turn` >= K (0-based over the episode: rounds after the first):
        the whole transcript so far, as the task lists earlier answers in a chain
        (`chain_template`); without knowledge transfer the observer template with only the
        agent's own earlier answers, one per line."""
        if knowledge_transfer:
            return self.chain_template(turn)
        own = range(turn % n_agents + 1, turn + 1, n_agents)
        return self.observer_template.replace(RESPONSE, "\n".join(map(response_slot, own)))

    def templates(self, knowledge_transfer: bool, n_agents: int = 2,
                  rounds: int = 1) -> tuple[Template, ...]:
        """The templates of every turn: the K = n_agents chain positions (pioneer first) for a
        knowledge-transfer setting (without it every later position sees only the query),
        then, with rounds > 1, `round_template` for each later turn."""
        if not knowledge_transfer:
            alone = self.observer_template_no_kt or self.pioneer_template
            first = [self.pioneer_template] + [alone] * (n_agents - 1)
        else:
            first = [self.pioneer_template] + [self.observer_template if k == 1 else
                                               self.chain_template(k) for k in range(1, n_agents)]
        later = [self.round_template(j, n_agents, knowledge_transfer)
                 for j in range(n_agents, n_agents * rounds)]
        return tuple(Template(t) for t in [*first, *later])

    def state_text(self, query: Query, answers: Sequence[str], turn: int) -> str:
        """The `{state}` text of a turn, from the query and the earlier turns' answers (only
        tasks whose templates use `{state}` need it)."""
        raise NotImplementedError(f"task {self.name!r} uses {{state}} but has no state_text")

    def round_scores(self, queries: Sequence[Query], answers: Sequence[Sequence[str]],
                     n_agents: int, last: bool) -> np.ndarray | None:
        """The (K, B) task rewards at the end of a round, where `answers[j][i]` is turn j's
        answer in episode i (the round's turns are the last K; `last`: the episode ends), or
        None (the default): each of the round's answers scored by `reward`. A game reads the
        whole transcript."""
        return None

    def game_over(self, queries: Sequence[Query], answers: Sequence[Sequence[str]]
                  ) -> np.ndarray | None:
        """Which episodes have ended early after the latest turn ((B,) bools; None: never,
        the default): a game won."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


_REGISTRY: dict[str, Any] = {}


def register_task(name: str, factory=None):
    """Register a Task class or factory under a name; usable as a decorator."""

    def add(f):

        if not isinstance(name, str) or not name:
            raise ValueError(f"task name must be a non-empty string, got {name!r}")
        if not callable(f):
            raise TypeError(f"register_task({name!r}) needs a Task class or factory, got {f!r}")
        check_not_builtin("task", name, _REGISTRY, f, ("cory_env",))
        if isinstance(f, type) and issubclass(f, Task) and "name" not in vars(f):
            f.name = name  # a class that names itself keeps its name
        _REGISTRY[name] = f
        return f

    return add(factory) if factory is not None else add


def make_task(task, **kwargs) -> Task:
    """Return a Task from a registered name, a Task instance or a Task class."""
    if isinstance(task, Task):
        if kwargs:
            raise ValueError(f"task options {sorted(kwargs)} need a task name, not an instance")
        return task
    if isinstance(task, type) and issubclass(task, Task):
        return task(**kwargs)
    if isinstance(task, str):
        _discover()
        if task not in _REGISTRY:
            raise ValueError(unknown_task(task))
        factory = _REGISTRY[task]
        accepted = task_defaults(task)
        takes_any = any(p.kind == p.VAR_KEYWORD for p in _parameters(factory))
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown and not takes_any:
            raise ValueError(f"task {task!r} has no option(s) {unknown}; it takes "
                             f"{sorted(accepted) or 'none'}")
        check_option_types(task, factory, kwargs)
        return factory(**kwargs)
    raise TypeError(f"task must be a name, Task or Task class, got {type(task).__name__}")


def is_exact_match(task) -> bool:
    """Whether a task (a name, class or instance) has an exact-match reward."""
    if isinstance(task, str):
        _discover()
        task = _REGISTRY.get(task)
    return bool(getattr(task, "exact_match", False))


def offline_model(task) -> str | None:
    """The offline reference LM recipe of a task (a name, class or instance), or None."""
    if isinstance(task, str):
        _discover()
        task = _REGISTRY.get(task)
    return getattr(task, "offline_model", None)


def registered_tasks() -> list[str]:
    """Names of all registered tasks (installed `cory.tasks` entry points included)."""
    _discover()
    return sorted(_REGISTRY)


def unknown_task(name) -> str:
    """What to say of a task name nobody registered."""
    return (f"unknown task {name!r}; registered: {sorted(_REGISTRY)}. A task of your own "
            f"registers when the module that defines it is imported: import it first (command "
            f"lines: --import MODULE or --import path/to/file.py)")


def task_defaults(name: str) -> dict[str, Any]:
    """The keyword options of a registered task and their defaults (from its signature)."""
    _discover()
    if name not in _REGISTRY:
        raise ValueError(unknown_task(name))
    params = _parameters(_REGISTRY[name])
    return {p.name: (None if p.default is p.empty else p.default) for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


_SIMPLE = (bool, int, float, str, tuple, list, dict)


def check_option_types(name: str, factory, options: dict) -> None:
    """Raise ValueError naming the option when a value does not match its annotated type
    (plain types and unions of them; others are left to the task's own checks)."""
    try:
        hints = typing.get_type_hints(factory.__init__ if isinstance(factory, type) else factory)
    except Exception:  # unresolvable annotations: nothing to check against
        return
    for key, value in options.items():
        allowed = _allowed_types(hints.get(key))
        if allowed is None or isinstance(value, tuple(allowed)) and not (
                isinstance(value, bool) and bool not in allowed):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and float in allowed:
            continue
        names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
        raise ValueError(f"task {name!r} option {key}={value!r} must be {names}, got "
                         f"{type(value).__name__}")


def _allowed_types(hint) -> list[type] | None:
    """The plain types a hint allows (None when it is not made of plain types)."""
    if hint is None:
        return None
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) \
        else (hint,)
    out = []
    for a in args:
        a = typing.get_origin(a) or a
        if a is type(None) or a in _SIMPLE:
            out.append(a)
        else:
            return None
    return out


def _parameters(factory) -> list[inspect.Parameter]:
    """A factory's signature parameters ([] if it has none to show)."""
    try:
        return list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return []


@functools.cache
def register_builtin() -> None:
    """Import every module of this package once: each registers the tasks it defines."""
    package = __name__.rpartition(".")[0]
    for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
        importlib.import_module(f"{package}.{module.name}")


def _discover() -> None:
    """The built-in tasks, then the installed `cory.tasks` entry points."""
    register_builtin()
    load_entry_points("cory.tasks")


def held_out(text: str, share: int) -> bool:
    """Whether a query text belongs to the test split: one text in `share`, by a hash of it
    (the same on every machine), so no text is in both splits."""
    return zlib.crc32(text.encode()) % share == 0


def last_number(text: str) -> str | None:
    """The last number in a text (commas stripped), as GSM8K-style exact-match rewards use."""
    found = re.findall(r"-?\d[\d,]*\.?\d*", text)
    if not found:
        return None
    num = found[-1].replace(",", "").rstrip(".")
    if "." in num:
        num = num.rstrip("0").rstrip(".")
    return num


def exact_match_reward(queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
    """1.0 where the response's last number equals the query's answer, else 0.0."""
    return np.array(
        [float(last_number(r) is not None and last_number(r) == q.answer)
         for q, r in zip(queries, responses)],
        dtype=np.float32,
    )
