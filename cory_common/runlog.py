"""A folder of records' guarantees: one writer, a ledger of records you can trust, the code it ran.

Shared by the benchmark's study folders and `python -m agents.distributed`'s study folder:

    with RunLock("runs/x"):           # one writer per folder; a second is told who holds it
        append_jsonl(path, records)   # the ledger grows by whole lines, flushed to disk
        resume_ledger(path, {"run": key}, 15)   # verify what the checkpoint vouches for

* **One writer.** `RunLock` is an OS file lock (`filelock`), released by the kernel when its
  holder exits, even by SIGKILL, so it never goes stale.
* **The ledger.** Records are JSON lines appended whole. On resume every record of the run
  before the checkpoint's iteration must be present, parseable and in order; otherwise
  resume is refused naming the file and the first bad line. Only records written after the
  checkpoint (which the resumed run writes again) and a line torn by a kill are dropped.
* **The code.** `code_identity` hashes each `--import` file, so a resume can refuse code that
  changed since the run started.
"""

from __future__ import annotations

import functools
import getpass
import gzip
import importlib.metadata
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

from cory_common.files import atomic_write, current_umask, file_digest


class LedgerError(ValueError):
    """A folder's records cannot be trusted (the message names the file and the line)."""


# ------------------------------------------------------------------------------- reading
def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON-lines file, or of its gzipped copy PATH.gz where PATH is missing
    (neither: none). A line that is not a JSON object raises LedgerError naming the file and
    the line; only a torn last line (no newline: a write in progress, or cut by a kill) is left
    out, with a warning that names it."""
    path = Path(path)
    if path.exists():
        return _parse(path.read_text(encoding="utf-8"), path)
    if packed := packed_only(path):
        return _parse(gzip.decompress(packed.read_bytes()).decode("utf-8"), packed)
    return []


def packed_only(path: str | os.PathLike) -> Path | None:
    """PATH.gz where it exists and PATH does not (records a writer cannot append to), else None."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    return packed if packed.exists() and not path.exists() else None


def _parse(text: str, path: Path) -> list[dict]:
    """The JSON-object lines of a text (see read_jsonl)."""
    records, torn = _records(text, path)
    if torn:
        last = text.count("\n") + 1
        warnings.warn(f"{path}, line {last}: a torn last record (a write in progress, or cut by "
                      f"a kill) is left out", RuntimeWarning, stacklevel=3)
    return [record for _, record in records]


def _records(text: str, path: Path) -> tuple[list[tuple[int, dict]], bool]:
    """(line number, record) of every line, and whether the last line is torn (no newline and
    not JSON: a write in progress or a kill mid-write); any other bad line raises LedgerError
    naming the file and the line."""
    lines = text.split("\n")
    out, torn = [], False
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):  # no newline after it
                torn = True
                continue
            raise LedgerError(f"{path}, line {i}: not a JSON record: {line[:80]!r}") from None
        if not isinstance(record, dict):
            raise LedgerError(f"{path}, line {i}: not a JSON object: {line[:80]!r}")
        out.append((i, record))
    return out, torn


def ledger(path: str | os.PathLike) -> tuple[list[tuple[int, dict]], bool]:
    """(line number, record) of every line, strictly, and whether the last line is torn (no
    newline and not JSON: a kill mid-write). Any other bad line raises LedgerError."""
    path = Path(path)
    if not path.exists():
        return [], False
    out, torn = _records(path.read_text(encoding="utf-8"), path)
    for i, record in out:
        it = record.get("iteration")
        if it is not None and (isinstance(it, bool) or not isinstance(it, int)):
            raise LedgerError(f"{path}, line {i}: \"iteration\" must be an integer, got {it!r}")
    return out, torn


def jsonl_text(records: Iterable[dict]) -> str:
    """Records as JSON-lines text."""
    return "".join(json.dumps(r, default=str) + "\n" for r in records)


def append_jsonl(path: str | os.PathLike, records: list[dict]) -> None:
    """Append records, flushed to disk (after a newline if a kill left a torn line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torn = False
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(("\n" if torn else "") + jsonl_text(records))
        f.flush()
        os.fsync(f.fileno())


def resume_ledger(path: str | os.PathLike, match: dict, iteration: int,
                  iteration_of: Callable[[dict], int] = lambda r: r["iteration"],
                  complete: bool = True) -> int:
    """Verify a run's records before a resume from `iteration` and drop those after it.

    The run's records (those whose fields equal `match`) before `iteration` must be
    parseable and in order, and with `complete` cover every iteration 0 .. iteration−1;
    otherwise LedgerError names the file and the first bad line, and nothing is changed.
    Records at or after `iteration` (written after the checkpoint) and a torn last line are
    dropped; every other line, a user's included, is kept byte for byte. Returns the number
    of lines dropped.
    """
    path = Path(path)
    rows, torn = ledger(path)
    mine = [(i, r) for i, r in rows if all(r.get(k) == v for k, v in match.items())]
    seen, last = set(), -1
    for line, r in mine:
        it = iteration_of(r)
        if it < iteration:
            if it < last:
                raise LedgerError(f"{path}, line {line}: iteration {it} after iteration {last}; "
                                  f"the records are out of order")
            last = it
            seen.add(it)
    if complete:
        missing = sorted(set(range(iteration)) - seen)
        if missing:
            first = missing[0]
            raise LedgerError(
                f"{path}: the records of {_label(match)} lack iteration(s) {_span(missing)} "
                f"before the checkpoint at iteration {iteration} (first missing: {first}); "
                f"start over in a new folder, or restore the file")
    drop = {line for line, r in mine if iteration_of(r) >= iteration}
    if not drop and not torn:
        return 0
    text = path.read_text(encoding="utf-8").split("\n")
    kept = [line for i, line in enumerate(text, 1) if i not in drop and line.strip()
            and not (torn and i == len(text))]
    atomic_write(path, "".join(line + "\n" for line in kept))
    return len(drop) + int(torn)


def _label(match: dict) -> str:
    """A record filter as text."""
    return ", ".join(f"{k}={v!r}" for k, v in match.items()) or "the run"


def _span(xs: list[int]) -> str:
    """Sorted integers as compact ranges: 3-5, 9."""
    out, start = [], xs[0]
    for a, b in zip(xs, xs[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


# ------------------------------------------------------------------------------- the lock
class FolderBusy(RuntimeError):
    """Another process holds the folder."""


class RunLock:
    """An exclusive lock on a folder of records for this process's life (see the module docstring).

    The holder's pid, host, user, command and start time go to `.lock.owner`, so a refused
    writer is told who holds the folder.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.owner = self.folder / ".lock.owner"
        self._lock = None

    def acquire(self) -> RunLock:
        """Take the lock (creating the folder) or raise FolderBusy naming the holder."""
        from filelock import FileLock, Timeout

        self.folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.folder / ".lock", timeout=0, mode=0o666 & ~_umask())
        try:
            lock.acquire()
        except Timeout:
            raise FolderBusy(f"folder {self.folder} is in use by {self.holder()}; wait for "
                             f"it to finish, or choose another --out") from None
        self._lock = lock
        atomic_write(self.owner, json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(), "user": _user(),
            "command": " ".join(sys.argv), "since": time.strftime("%Y-%m-%d %H:%M:%S")}))
        return self

    def holder(self) -> str:
        """Who holds the folder, as text."""
        try:
            o = json.loads(self.owner.read_text())
            return (f"process {o['pid']} on {o['host']} (user {o['user']}, since {o['since']}: "
                    f"{o['command']})")
        except (OSError, ValueError, KeyError):
            return "another process"

    def release(self) -> None:
        """Release the lock (the kernel also does when the process ends)."""
        if self._lock is not None:
            self.owner.unlink(missing_ok=True)
            self._lock.release()
            self._lock = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _umask() -> int:
    """The process umask."""
    return current_umask()


def _user() -> str:
    """The current user's name, or "?"."""
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers)
        return "?"


# ------------------------------------------------------------------------------- the code
def code_identity(imports: Iterable[str] = ()) -> dict:
    """The package version, its git commit (when run from a checkout) and a sha256 of each
    `--import` file or module, for run_config.json."""
    files = {}
    for spec in imports or ():
        path = _plugin_file(spec)
        files[spec] = {"path": str(path) if path else None,
                       "sha256": file_digest(path) if path else None}
    try:
        version = importlib.metadata.version("cory")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"version": version, "commit": _commit(), "imports": files}


def changed_code(saved: dict, now: dict) -> list[str]:
    """The `--import` files whose hash differs from the saved identity, as messages."""
    out = []
    for spec, was in (saved.get("imports") or {}).items():
        is_ = (now.get("imports") or {}).get(spec, {})
        if was.get("sha256") != is_.get("sha256"):
            out.append(f"--import {spec} ({is_.get('path') or was.get('path')}) changed since "
                       f"the run started (sha256 {str(was.get('sha256'))[:12]} -> "
                       f"{str(is_.get('sha256'))[:12]})")
    return out


def _plugin_file(spec: str) -> Path | None:
    """The file a `--import` spec names (a .py path, or a module's source)."""
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        path = Path(spec).expanduser().resolve()
        return path if path.is_file() else None
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):
        return None
    return Path(found.origin) if found and found.origin and os.path.isfile(found.origin) else None


def _commit() -> str | None:
    """The git commit of the checkout this package runs from, with "-dirty" when its tracked
    files differ from it (None outside a checkout)."""
    here = Path(__file__).resolve().parents[1]  # the checkout's root (.git: a folder or file)
    if not (here / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=5).stdout.strip()
        changed = subprocess.run(["git", "-C", str(here), "status", "--porcelain",
                                  "--untracked-files=no"], capture_output=True, text=True,
                                 timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("-dirty" if changed else "")) if head else None


@functools.cache
def code_commit() -> str | None:
    """The commit the running code is (see `_commit`), computed once per process."""
    return _commit()
