"""The learner registry: learner names, method names, and resolving a method to a learner on a
structure (`resolve_method`: the registered names, or any `learner/structure`).

Every module of `agents.learners` registers what it defines on import; `register_builtin`
imports them all, then the installed `cory.learners` entry points.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass

from cory_common.plugins import check_not_builtin, load_entry_points

from .learner import Learner
from .structure import SINGLE, Structure, structures

_LEARNERS: dict[str, type[Learner]] = {}  # learner name -> class
_METHODS: dict[str, tuple[str, Structure]] = {}  # method name -> (learner, structure)
_ABLATES: dict[str, str] = {}  # ablation method name -> the mechanism it turns off


def register_learner(name: str, *old, **old_keywords):
    """Class decorator: make a Learner available as the learner `name` and, when it can train
    one agent (`min_agents == 1`), as the method `name`: the learner on one agent (`single`). A
    bare learner name means that for every learner; `cory-<name>` is registered by the
    learner's module for it on CORY's structure."""
    if old or old_keywords:  # cory 0.1's call also took the structure of the method `name`
        given = ", ".join([repr(name), *map(repr, old),
                           *(f"{k}={v!r}" for k, v in old_keywords.items())])
        raise TypeError(f"register_learner({given}) is cory 0.1's call: since 0.2 it takes the "
                        f"name alone (@register_learner({name!r}): {name!r} is then the learner "
                        f"on one agent), and a method on a structure is "
                        f"register_method('cory-{name}', {name!r}, CORY) (CHANGELOG.md)")

    def add(cls):
        if not (isinstance(cls, type) and issubclass(cls, Learner)):
            raise TypeError(f"register_learner({name!r}) needs a Learner subclass, got {cls!r}")
        if cls.update is Learner.update:
            raise TypeError(f"learner {name!r} ({cls.__qualname__}) has no update(turns, "
                            f"iteration): every learner turns a rollout into updates there "
                            f"(agents/learners/reinforce.py is the worked example)")
        check_not_builtin("learner", name, _LEARNERS, cls, ("agents",))
        cls.name = name
        _LEARNERS[name] = cls
        if cls.min_agents == 1:
            _METHODS[name] = (name, SINGLE)
        return cls

    return add


def register_method(name: str, learner: str, structure: Structure,
                    ablates: str | None = None) -> None:
    """Make `name` a method: the registered `learner` on `structure` (`ablates`: the one
    mechanism it turns off, when it is one of the paper's ablations)."""
    if "/" in name:
        raise ValueError(f"a method name cannot hold '/', got {name!r}")
    _METHODS[name] = (learner, structure)
    if ablates:
        _ABLATES[name] = ablates


@functools.cache
def register_builtin() -> None:
    """Import every module of this package (each registers the learners and methods it
    defines), then the installed `cory.learners` entry points (once)."""
    for module in pkgutil.iter_modules(importlib.import_module(__package__).__path__):
        importlib.import_module(f"{__package__}.{module.name}")
    load_entry_points("cory.learners")


@dataclass(frozen=True)
class Method:
    """A method name resolved: a learner (a Learner class) on a structure."""

    name: str
    learner: type[Learner]
    structure: Structure

    @property
    def n_agents(self) -> int:
        """The default K."""
        return self.structure.n_agents


def resolve_method(name: str) -> Method:
    """The learner and structure of a method name (registered, or `learner/structure`)."""
    register_builtin()
    if not isinstance(name, str):
        raise ValueError(f"method must be a name, got {name!r}")
    if "/" in name:
        learner, _, structure = name.partition("/")
        known = structures()
        if structure not in known:
            raise ValueError(f"unknown structure {structure!r} in method {name!r}; "
                             f"registered structures: {sorted(known)}")
        pair = (learner, known[structure])
    elif name in _METHODS:
        pair = _METHODS[name]
    elif name in _LEARNERS:  # a learner that needs a chain has no bare method name
        with_it = sorted(m for m, (learner, _) in _METHODS.items() if learner == name)
        raise ValueError(f"{name!r} is a learner that needs {_LEARNERS[name].min_agents}+ "
                         f"agents, so it has no single-agent method: use "
                         f"{', '.join(with_it) or '-'} or {name}/STRUCTURE (structures: "
                         f"{sorted(structures())})")
    else:
        raise ValueError(f"unknown method {name!r}; registered methods: {registered_methods()} "
                         f"(or learner/structure)")
    if pair[0] not in _LEARNERS:
        raise ValueError(f"unknown learner {pair[0]!r} in method {name!r}; registered "
                         f"learners: {sorted(_LEARNERS)}")
    return Method(name, _LEARNERS[pair[0]], pair[1])


def learner_class(name: str) -> type[Learner]:
    """The Learner class of a method name."""
    return resolve_method(name).learner


def registered_methods() -> list[str]:
    """Names of all registered methods."""
    register_builtin()
    return sorted(_METHODS)


def ablation_methods() -> tuple[str, ...]:
    """The registered methods that are the paper's ablations (each registered with the
    mechanism it turns off)."""
    return tuple(m for m in registered_methods() if m in _ABLATES)


def registered_learners() -> list[str]:
    """Names of all registered learners."""
    register_builtin()
    return sorted(_LEARNERS)


def registered_structures() -> list[str]:
    """Names of all registered structures."""
    register_builtin()
    return sorted(structures())
