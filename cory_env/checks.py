"""Checks of settings that name the bad value (a leaf module: every layer may use it)."""

from __future__ import annotations

import numbers


def check_int(name: str, value, low: int | None = None, high: int | None = None,
              none_ok: bool = False) -> None:
    """Raise ValueError naming `name` unless value is an integer (not a bool) in [low, high),
    or None when `none_ok`."""
    if none_ok and value is None:
        return
    integer = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if integer and (low is None or value >= low) and (high is None or value < high):
        return
    kind = ("a positive integer" if low == 1 and high is None else
            "a non-negative integer" if low == 0 and high is None else
            f"an integer in [{low}, {high})" if low is not None and high is not None else
            f"an integer >= {low}" if low is not None else "an integer")
    raise ValueError(f"{name} must be {'None or ' if none_ok else ''}{kind}, got {value!r}")
