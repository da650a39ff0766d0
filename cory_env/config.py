"""Typed, validated configuration shared by the AEC env and the batched env."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, fields
from typing import Any

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
    swap_roles: bool = False  # the agent-order flag: False -> llm_0 is the pioneer
    knowledge_transfer: bool = True  # the observer sees the pioneer's response
    reward_mode: str = "collective"  # "collective" (r_pio + r_obs to both) or "individual"
    single_agent: bool = False  # only llm_0 acts (the single-agent PPO baseline)
    render_mode: str | None = None
    seed: int | None = None
    split: str = "train"
    action_mask: bool = False  # add an all-ones "action_mask" to observations

    def validate(self) -> EnvConfig:
        """Check every field, raising a ValueError/TypeError that names the bad value."""
        for name in ("swap_roles", "knowledge_transfer", "single_agent", "action_mask"):
            check_bool(name, getattr(self, name))
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {self.reward_mode!r}")
        if self.render_mode is not None and self.render_mode not in RENDER_MODES:
            raise ValueError(f"render_mode must be one of {RENDER_MODES} or None, "
                             f"got {self.render_mode!r}")
        for name in ("max_new_tokens", "context_len"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise TypeError(f"seed must be an int or None, got {self.seed!r}")
        return self

    def resolve(self) -> tuple[Task, Any, int, int]:
        """Build (task, tokenizer, max_new_tokens, context_len) from the settings."""
        self.validate()
        task = make_task(self.task)
        tokenizer = load_tokenizer(self.tokenizer) if self.tokenizer is not None else task.tokenizer
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos_token_id")
        max_new = self.max_new_tokens or task.default_max_new_tokens
        context = self.context_len or task.default_context_len
        if context <= max_new:
            raise ValueError(f"context_len ({context}) must exceed max_new_tokens ({max_new})")
        return task, tokenizer, max_new, context

    @classmethod
    def from_kwargs(cls, **kwargs) -> EnvConfig:
        """Build a config from keywords, naming any unknown key."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown env config keys {unknown}; known: {sorted(known)}")
        return cls(**kwargs).validate()


def load_tokenizer(tokenizer):
    """Return an HF tokenizer from an object or a local/hub path."""
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_bool(name: str, value) -> None:
    """Raise TypeError unless value is a bool (numpy bools accepted)."""
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
