"""Files that are whole or absent: the project's one atomic-write helper, for files and folders.

    atomic_write("run/config.json", text)              # str, bytes, or a writer f(binary_file)
    with atomic_dir("cache/models/x") as tmp:          # fill tmp; it becomes the folder at the end
        ...

A file is written to a temporary sibling, flushed to disk and renamed over the target, so a
kill at any moment leaves either the old contents or the new ones, never a torn file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: str | os.PathLike, data: str | bytes | Callable[[BinaryIO], None]) -> None:
    """Write text, bytes or what `data(f)` writes to a binary file at `path`, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike, replace: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it becomes `final` in one rename.

    If `final` exists: with `replace` the old folder is swapped out and removed, otherwise the
    existing one is kept (another process built it first) and the new copy is discarded.
    On error nothing is left behind.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a finished folder reads like mkdir's
    try:
        yield tmp
        if replace and final.exists():
            remove_dir(final)
        try:
            os.replace(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_dir(path: str | os.PathLike) -> None:
    """Remove a folder by first renaming it aside, so its name is free at once."""
    path = Path(path)
    if not path.exists():
        return
    trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    os.replace(path, trash / "x")
    shutil.rmtree(trash, ignore_errors=True)
