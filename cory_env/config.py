"""Typed, validated configuration shared by the AEC env and the batched env."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from cory_common.checks import check_bool, is_int
from cory_common.pretrained import load_tokenizer

from .core import Episodes
from .tasks.base import Task, make_task

REWARD_MODES = ("collective", "individual")
RENDER_MODES = ("human", "ansi")


@dataclass
class EnvConfig:
    """Settings of a CORY env; every field is also a keyword of `env()` and `BatchedCoryEnv`."""

    task: Any = "sentiment"  # registered name, Task instance or Task class
    tokenizer: Any = None  # HF tokenizer object or path; None -> the task's own
    max_new_tokens: int | None = None  # None -> the task's default
    context_len: int | None = None  # observation length L; None -> the task's default
    n_agents: int = 2  # K: a chain llm_0..llm_{K-1}, each seeing the answers before it
    rounds: int = 1  # R: the chain repeats R times, every agent speaking once per round
    rotation: int = 0  # the order offset: position k is played by llm_{(k + rotation) % K}
    knowledge_transfer: bool = True  # the observer sees the pioneer's response
    reward_mode: str = "collective"  # "collective" (r_pio + r_obs to both) or "individual"
    render_mode: str | None = None
    seed: int | None = None
    split: str = "train"
    action_mask: bool = False  # add an all-ones "action_mask" to observations
    max_cycles: int | None = None  # PettingZoo's cap: each agent acts at most this many times

    def validate(self) -> EnvConfig:
        """Check every field, raising a ValueError/TypeError that names the bad value."""
        for name in ("knowledge_transfer", "action_mask"):
            check_bool(name, getattr(self, name))
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {self.reward_mode!r}")
        if self.render_mode is not None and self.render_mode not in RENDER_MODES:
            raise ValueError(f"render_mode must be one of {RENDER_MODES} or None, "
                             f"got {self.render_mode!r}")
        if not is_int(self.n_agents) or self.n_agents < 1:
            raise ValueError(f"n_agents must be a positive integer, got {self.n_agents!r}")
        check_rotation(self.rotation, self.n_agents)
        if not is_int(self.rounds) or self.rounds < 1:
            raise ValueError(f"rounds must be a positive integer, got {self.rounds!r}")
        for name in ("max_new_tokens", "context_len", "max_cycles"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.seed is not None and not is_int(self.seed):
            raise TypeError(f"seed must be an int or None, got {self.seed!r}")
        return self

    def resolve(self) -> tuple[Task, Any, int, int]:
        """Build (task, tokenizer, max_new_tokens, context_len) from the settings."""
        self.validate()
        task = make_task(self.task)
        if self.tokenizer is None:
            tokenizer = task.tokenizer
        else:
            tokenizer = load_tokenizer(self.tokenizer)
            if task.takes_run_tokenizer:
                task.use_tokenizer(tokenizer)
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos_token_id")
        max_new = self.max_new_tokens or task.default_max_new_tokens
        if self.max_cycles is not None:
            max_new = min(max_new, self.max_cycles)
        context = self.context_len or task.default_context_len
        if context <= max_new:
            raise ValueError(f"context_len ({context}) must exceed max_new_tokens ({max_new})")
        return task, tokenizer, max_new, context

    def episodes(self):
        """The episodes these settings describe (task, tokenizer and lengths resolved)."""
        task, tokenizer, max_new, context = self.resolve()
        return Episodes(task, tokenizer, max_new_tokens=max_new, context_len=context,
                        knowledge_transfer=self.knowledge_transfer, reward_mode=self.reward_mode,
                        n_agents=self.n_agents, rounds=int(self.rounds),
                        max_cycles=self.max_cycles, fit_context=self.context_len is None,
                        split=self.split)

    @classmethod
    def from_kwargs(cls, **kwargs) -> EnvConfig:
        """Build a config from keywords, naming any unknown key."""
        known = {f.name for f in fields(cls)}
        for name in sorted(set(kwargs) & set(GONE_KEYS)):
            raise TypeError(f"{name} is gone: {GONE_KEYS[name]}")
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown env config keys {unknown}; known: {sorted(known)}")
        return cls(**kwargs).validate()


SWAP_ROLES_GONE = ("role order is one option, rotation: rotation=1 makes llm_1 the pioneer "
                   "(position k is played by llm_{(k + rotation) % K})")
GONE_KEYS = {"swap_roles": SWAP_ROLES_GONE,  # refused by name, with the option that replaced them
             "single_agent": "one agent acting alone is n_agents=1 (only llm_0 acts)"}


def check_rotation(rotation, n_agents: int, what: str = "rotation") -> int:
    """The rotation offset mod K (0 for one agent), or a ValueError naming a non-integer: the
    one check and reduction of a rotation, where it enters (a config field, a reset option)."""
    if isinstance(rotation, bool) or not is_int(rotation):
        raise ValueError(f"{what} must be an integer, got {rotation!r}")
    return 0 if n_agents == 1 else int(rotation) % n_agents
