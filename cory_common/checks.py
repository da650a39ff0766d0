"""Checks of settings that name the bad value, and the field metadata every config uses."""

from __future__ import annotations

import numbers
from dataclasses import fields

import numpy as np


def check_int(name: str, value, low: int | None = None, high: int | None = None,
              none_ok: bool = False) -> None:
    """Raise ValueError naming `name` unless value is an integer (not a bool) in [low, high),
    or None when `none_ok`."""
    if none_ok and value is None:
        return
    if is_int(value) and (low is None or value >= low) and (high is None or value < high):
        return
    kind = ("a positive integer" if low == 1 and high is None else
            "a non-negative integer" if low == 0 and high is None else
            f"an integer in [{low}, {high})" if low is not None and high is not None else
            f"an integer >= {low}" if low is not None else "an integer")
    raise ValueError(f"{name} must be {'None or ' if none_ok else ''}{kind}, got {value!r}")


_KINDS = {"int": (numbers.Integral,), "float": (numbers.Real,), "bool": (bool, np.bool_),
          "str": (str,)}


def is_int(value) -> bool:
    """Whether value is an integer and not a bool (numpy integers count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def meta(text: str, **kw) -> dict:
    """Field metadata of one config option: its help text, plus `flag` or `cli` keys if given
    (read by `cory_common.cli` to make command-line options)."""
    return {"help": text, **kw}


def check_fields(cfg) -> None:
    """Check a config dataclass's scalar fields against their annotations, naming the field.

    numpy scalars count as their Python kind and are converted to it (np.int64(4) -> 4);
    bools are not numbers here; a NaN float is refused. Fields of other types are left to
    the config's own checks.
    """
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.metadata.get("check") is False:  # the config checks this one itself
            continue
        if isinstance(value, np.generic):
            value = value.item()
            setattr(cfg, f.name, value)
        ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        parts = [p.strip() for p in ann.split("|")]
        kinds = [p for p in parts if p != "None"]
        if len(kinds) != 1 or kinds[0] not in _KINDS or (value is None and "None" in parts):
            continue
        kind = kinds[0]
        ok = isinstance(value, _KINDS[kind]) and (kind == "bool" or not isinstance(value, bool))
        if ok and kind == "float" and value != value:
            ok = False
        if not ok:
            what = f"{'an' if kind == 'int' else 'a'} {kind}" + (" or None" if "None" in parts
                                                                else "")
            raise ValueError(f"{type(cfg).__name__}.{f.name} must be {what}, got {value!r} "
                             f"({type(value).__name__})")


def check_bool(name: str, value) -> None:
    """Raise TypeError unless value is a bool (numpy bools accepted)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
