"""On-disk cache for offline assets: an entry is a directory that is either whole or absent."""

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


def cache_dir() -> Path:
    """Return the cache root ($CORY_CACHE or ~/.cache/cory), creating it if needed."""
    root = Path(os.environ.get("CORY_CACHE") or Path.home() / ".cache" / "cory")
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def atomic_write_dir(final: Path) -> Iterator[Path]:
    """Yield a temp dir next to ``final``; on success move it to ``final`` in one rename.

    If ``final`` already exists (another process won the race) the new copy is discarded.
    On error nothing is left behind.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; cache entries should be readable like mkdir's
    try:
        yield tmp
        try:
            os.replace(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached_dir(final: Path, build: Callable[[Path], None]) -> Path:
    """Return ``final``, first running ``build(tmp_dir)`` atomically if it does not exist."""
    if not Path(final).is_dir():
        with atomic_write_dir(final) as tmp:
            build(tmp)
    return Path(final)
