"""Merge study folders of one setting into one folder.

    python -m benchmarks.merge --out runs/all runs/seeds-0-2 runs/seeds-3-4
    python -m benchmarks.run --resume --out runs/all     # measures the mechanism, runs the rest

A folder has one writer, so runs made side by side live in several folders; merged, they are
one study that `benchmarks.report` reads and `benchmarks.run --resume` continues. Every folder
must hold the same settings except `methods` and `seeds`, and the same `--import` code. Only
finished runs (a `done/` marker) are taken, each from exactly one folder: their records,
evaluations, TensorBoard scalars, checkpoints and markers. run_config.json gets the union of
methods and seeds; log.txt says where each run came from and at which commit. Nothing is
written until every check passes; the new folder appears whole (built beside it, then renamed).
Mechanism files are not copied: a measurement from one folder's checkpoints covers only its
seeds; `--resume` measures the merged folder's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path

from benchmarks.evidence.records import check_format
from benchmarks.settings.config import GROWABLE, from_saved
from benchmarks.study.coordinator import StudyFolder
from cory_common import cli
from cory_common.files import atomic_write, remove_dir
from cory_common.runlog import FolderBusy, RunLock, read_jsonl
from cory_common.threads import configure

NOT_COMPARED = (*GROWABLE, "code", "format")


def _saved(folder: Path) -> dict:
    """A source folder's run_config.json, or a ValueError naming the folder."""
    path = StudyFolder(folder).config
    if not path.is_file():
        raise ValueError(f"{folder} holds no run (no run_config.json)")
    saved = json.loads(path.read_text())
    check_format(saved, path)
    _config(saved, path)
    return saved


def _config(saved: dict, where) -> None:
    """Refuse settings this version cannot read or that do not validate, naming `where`."""
    try:
        from_saved({k: v for k, v in saved.items() if k not in ("code", "format")}).validate()
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None


def _flat(settings: dict, prefix: str = "") -> dict:
    """{"train.ppo.lr": 0.0005, ...}: nested settings by their dotted names."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _other_code(first: dict, code: dict) -> list[str]:
    """Each `--import` file whose sha256 differs between two folders' code, as text."""
    a, b = first.get("imports") or {}, code.get("imports") or {}
    sha = lambda d, spec: str((d.get(spec) or {}).get("sha256") or "absent")[:12]  # noqa: E731
    return [f"--import {spec}: sha256 {sha(a, spec)} against {sha(b, spec)}"
            for spec in sorted(set(a) | set(b)) if sha(a, spec) != sha(b, spec)]


def _check_same(folders: list[Path], saved: list[dict], allow_changed_code: bool) -> list[str]:
    """A ValueError naming the first setting a folder differs in; the code notes to log."""
    first, notes = _flat({k: v for k, v in saved[0].items() if k not in NOT_COMPARED}), []
    for folder, s in zip(folders[1:], saved[1:]):
        flat = _flat({k: v for k, v in s.items() if k not in NOT_COMPARED})
        for key in sorted(set(flat) | set(first)):
            if flat.get(key) != first.get(key):
                raise ValueError(f"{folder} differs from {folders[0]} in {key}: "
                                 f"{flat.get(key)!r} against {first.get(key)!r}")
        changed = _other_code(saved[0].get("code") or {}, s.get("code") or {})
        if changed and not allow_changed_code:
            raise ValueError(f"{folder} ran other code than {folders[0]}: " + "; ".join(changed)
                             + " (pass --allow-changed-code to merge them anyway)")
        notes += [f"merged with other code (--allow-changed-code): {folder}: {m}"
                  for m in changed]
    return notes


def _finished(folders: list[Path]) -> dict[str, Path]:
    """{run key: its folder} of every finished run; a ValueError for a run finished twice."""
    where: dict[str, Path] = {}
    for folder in folders:
        done = folder / "done"
        for key in sorted(p.name for p in done.iterdir()) if done.is_dir() else ():
            if key in where:
                raise ValueError(f"run {key} is finished in both {where[key]} and {folder}; "
                                 "merge folders of different runs")
            where[key] = folder
    return where


def _union(values: list[list]) -> list:
    """The values of every list, each once, in the order first met."""
    return list(dict.fromkeys(v for vs in values for v in vs))


def merge(out: str | os.PathLike, sources: list[str | os.PathLike],
          allow_changed_code: bool = False) -> dict:
    """Merge the finished runs of `sources` (one setting) into the new folder `out`; returns
    {run key: source folder}. Raises ValueError (or FolderBusy) before writing anything."""
    out, folders = Path(out), [Path(s) for s in sources]
    if len({f.resolve() for f in folders}) != len(folders):
        raise ValueError(f"a folder is named twice: {[str(f) for f in folders]}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} already exists; merge into a new folder")
    if out.resolve() in {f.resolve() for f in folders}:
        raise ValueError(f"--out {out} is one of the folders to merge")
    with contextlib.ExitStack() as held:
        for folder in folders:
            if not folder.is_dir():
                raise ValueError(f"{folder} is not a folder")
            held.enter_context(RunLock(folder))
        saved = [_saved(f) for f in folders]
        notes = _check_same(folders, saved, allow_changed_code)
        where = _finished(folders)
        if not where:
            raise ValueError(f"no finished run in {', '.join(map(str, folders))}")
        config = {**saved[0], "methods": _union([s["methods"] for s in saved]),
                  "seeds": sorted(_union([s["seeds"] for s in saved]))}
        _config(config, "the merged settings")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.merging-{os.getpid()}"
        remove_dir(tmp)
        try:
            _write(tmp, folders, saved, where, config, notes)
            if out.exists():
                out.rmdir()  # empty, checked above
            os.rename(tmp, out)
        finally:
            remove_dir(tmp)
    return where


def _write(tmp: Path, folders: list[Path], saved: list[dict], where: dict[str, Path],
           config: dict, notes: list[str]) -> None:
    """Build the merged folder at `tmp`."""
    new = StudyFolder(tmp)
    (tmp / "done").mkdir(parents=True)
    (tmp / "ckpt").mkdir()
    atomic_write(new.config, json.dumps(config, indent=2))
    for folder, s in zip(folders, saved):
        keys = sorted(k for k, f in where.items() if f == folder)
        source = StudyFolder(folder)
        rows = read_jsonl(source.metrics)
        new.append([r for r in rows if r.get("run") in keys])
        new.add_evals([r for r in read_jsonl(source.evals) if r.get("run") in keys])
        for key in keys:
            shutil.copy2(folder / "done" / key, tmp / "done" / key)
            ckpt = folder / "ckpt" / f"{key}.pt"
            if ckpt.exists():
                try:
                    os.link(ckpt, tmp / "ckpt" / ckpt.name)
                except OSError:  # another file system
                    shutil.copy2(ckpt, tmp / "ckpt" / ckpt.name)
            if (folder / "tb" / key).is_dir():
                shutil.copytree(folder / "tb" / key, tmp / "tb" / key)
        left = sorted({r["run"] for r in rows if "run" in r} - set(where))
        commit = str((s.get("code") or {}).get("commit") or "unknown")[:7]
        new.log(f"merged from {folder} (commit {commit}): {len(keys)} finished runs"
                + (f": {', '.join(keys)}" if keys else ""))
        if left:
            new.log(f"not merged from {folder}, unfinished: {', '.join(left)}")
    for note in notes:
        new.log(note)


def main(argv: list[str] | None = None) -> int:
    """Command line: merge study folders; errors name the folder and the setting."""
    parser = cli.Parser("python -m benchmarks.merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="study folders of one setting")
    parser.add_argument("--out", required=True, help="the new merged folder")
    parser.add_argument("--allow-changed-code", action="store_true",
                        help="merge folders whose --import files differ (logged)")
    args = parser.parse_args(argv)
    configure()
    try:
        where = merge(args.out, args.folders, args.allow_changed_code)
    except (ValueError, FolderBusy) as err:
        parser.error(str(err))
    print(f"merged {len(where)} finished runs into {args.out}; next: python -m benchmarks.run "
          f"--resume --out {args.out} (the mechanism, any run not finished, the report)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
