"""Files that are whole or absent: the project's one atomic-write helper, for files and folders.

    atomic_write("run/config.json", text)              # str, bytes, or a writer f(binary_file)
    with atomic_dir("cache/models/x") as tmp:          # fill tmp; it becomes the folder at the end
        ...

A file is written to a temporary sibling, flushed to disk and renamed over the target, so a
kill at any moment leaves either the old contents or the new ones, never a torn file.
"""

from __future__ import annotations

import contextlib
import hashlib
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
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes it 0600; match open()'s mode
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def current_umask() -> int:
    """The process's umask (read by setting it and restoring it at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_orphans(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary files and folders an interrupted `atomic_write` or `atomic_dir`
    left anywhere under `folder`; return what was removed. Call it only while no other
    process writes there (a study folder's lock holder)."""
    removed = []
    for p in sorted(Path(folder).rglob(".*")):
        if p.is_file() and p.name.endswith(".tmp"):
            p.unlink(missing_ok=True)
            removed.append(p)
        elif p.is_dir() and (".tmp-" in p.name or ".old-" in p.name):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


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


def looks_local(value) -> bool:
    """Whether a model/data name is meant as a local path (absolute, relative with a leading
    dot, or ~); hub names never start with one of those."""
    return isinstance(value, str) and value.startswith(("/", ".", "~"))


def check_local_path(name: str, value) -> None:
    """Raise ValueError naming the setting if value is a local path that does not exist
    (instead of the hub client calling it an invalid repo id)."""
    if looks_local(value) and not os.path.exists(os.path.expanduser(value)):
        raise ValueError(f"{name}={value!r}: no such file or folder")


def check_hub_name(what: str, name: str, filename: str = "config.json") -> None:
    """Fail fast, naming `what`, if `name` is neither a local path nor in the HF cache while
    the hub cannot be reached (instead of the hub client retrying for most of a minute)."""
    check_local_path(what, name)
    if not isinstance(name, str) or os.path.exists(os.path.expanduser(name)):
        return
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return  # transformers then answers from the cache at once
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, filename), str):
            return
    except Exception:  # an odd name: let the hub client say what is wrong with it
        return
    if not _hub_reachable():
        raise ValueError(f"{what}={name!r} is not a local folder, not in the Hugging Face "
                         f"cache, and the hub cannot be reached; pass a local folder (or set "
                         f"HF_HUB_OFFLINE=1 to use the cache)")


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the HF endpoint opens within `timeout` seconds."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def cache_dir() -> Path:
    """Return the cache root of offline assets ($CORY_CACHE or ~/.cache/cory), creating it."""
    root = Path(os.environ.get("CORY_CACHE") or Path.home() / ".cache" / "cory")
    root.mkdir(parents=True, exist_ok=True)
    return root


def cached_dir(final: Path, build: Callable[[Path], None]) -> Path:
    """Return ``final``, first running ``build(tmp_dir)`` atomically if it does not exist
    (a cache entry is a folder that is either whole or absent)."""
    if not Path(final).is_dir():
        with atomic_dir(final) as tmp:
            build(tmp)
    return Path(final)


def file_digest(path: str | os.PathLike) -> str:
    """A file's sha256 (hex), read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
