"""The on-disk cache of offline assets: an entry is a folder that is either whole or absent."""

import os
from collections.abc import Callable
from pathlib import Path

from ..files import atomic_dir


def cache_dir() -> Path:
    """Return the cache root ($CORY_CACHE or ~/.cache/cory), creating it if needed."""
    root = Path(os.environ.get("CORY_CACHE") or Path.home() / ".cache" / "cory")
    root.mkdir(parents=True, exist_ok=True)
    return root


def cached_dir(final: Path, build: Callable[[Path], None]) -> Path:
    """Return ``final``, first running ``build(tmp_dir)`` atomically if it does not exist."""
    if not Path(final).is_dir():
        with atomic_dir(final) as tmp:
            build(tmp)
    return Path(final)
