"""The metrics log of a run: JSON lines appended as training goes, trimmed on resume.

Shared by the benchmark's run folders and `python -m agents.distributed`, so a resumed run
drops exactly the records written after its checkpoint, and a line torn by a kill is ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from cory_env.files import atomic_write


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON-lines file (missing file: none; torn or bad lines skipped)."""
    path = Path(path)
    return _parse(path.read_text(encoding="utf-8")) if path.exists() else []


def _parse(text: str) -> list[dict]:
    """The JSON-object lines of a text (torn or bad lines skipped)."""
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


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


def keep_jsonl(path: str | os.PathLike, keep: Callable[[dict], bool]) -> int:
    """Rewrite the file atomically with only the records `keep` accepts; return lines dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    text = path.read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    kept = [r for r in _parse(text) if keep(r)]
    if len(kept) != len(lines):
        atomic_write(path, jsonl_text(kept))
    return len(lines) - len(kept)
