"""Rewrite a study folder of an earlier format once, in place, to the format this version reads.

    python -m benchmarks.migrate runs/X [runs/Y ...]

Each format step renames fields; values are unchanged, and a folder is taken through every step
from its format to this version's:

- 4 -> 5 gave the KL coefficient one name: records' `beta` is `kl_coef`, `eta` (the weight of
  the reported combined reward) is `report_kl_coef`, `sweep_eta` is `swept_kl_coef`; settings'
  `eta_sweep` is `kl_coef_sweep`, `train.eta` is `train.report_kl_coef`, `train.ppo.kl.beta` is
  `train.ppo.kl.coef`.
- 5 -> 6 names the seat of an alone evaluation as the training records do: alone.jsonl's
  `model` is `agent`.

Every file is checked and rewritten under the folder's lock, each atomically; a folder already
at this format is left as it is, and a file no step renames is not touched (it may stay
gzipped). Checkpoints are not rewritten: a migrated folder reports, re-renders and grows
(`--resume --seeds`), but an unfinished run of it restarts from its first iteration.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from benchmarks.evidence.records import FORMAT, no_records
from cory_common import cli
from cory_common.files import atomic_write
from cory_common.runlog import FolderBusy, RunLock, jsonl_text, packed_only, read_jsonl
from cory_common.threads import configure

_KL = {"beta": "kl_coef", "eta": "report_kl_coef", "sweep_eta": "swept_kl_coef"}
# format -> the renames that take it to the next: per record file, and settings by path
RECORD_FIELDS: dict[int, dict[str, dict[str, str]]] = {
    4: {"metrics.jsonl": _KL, "alone.jsonl": _KL},
    5: {"alone.jsonl": {"model": "agent"}},
}
SETTINGS: dict[int, dict[tuple, tuple]] = {
    4: {("eta_sweep",): ("kl_coef_sweep",), ("train", "eta"): ("train", "report_kl_coef"),
        ("train", "ppo", "kl", "beta"): ("train", "ppo", "kl", "coef")},
    5: {},
}


def renamed(record: dict, names: dict[str, str]) -> dict:
    """The record with its fields renamed, in the same order."""
    return {names.get(k, k): v for k, v in record.items()}


def migrated_config(config: dict, version: int) -> dict:
    """run_config.json's contents with the settings renamed since `version` (each in its
    place), at FORMAT."""
    def walk(node: dict, path: tuple, names: dict) -> dict:
        return {names.get((*path, k), (*path, k))[-1]:
                walk(v, (*path, k), names) if isinstance(v, dict) else v for k, v in node.items()}

    for step in range(version, FORMAT):
        config = walk(config, (), SETTINGS[step])
    return {**config, "format": FORMAT}


def migrate(folder: str | os.PathLike) -> str:
    """Rewrite one study folder to FORMAT; returns what was done, raises ValueError naming what
    it cannot read."""
    folder = Path(folder)
    why = no_records(folder)
    if why:
        raise ValueError(why)
    config_path = folder / "run_config.json"
    config = json.loads(config_path.read_text())
    version = config.get("format")
    if version == FORMAT:
        return f"{folder}: already format {FORMAT}"
    if version not in RECORD_FIELDS:
        raise ValueError(f"{folder} is study-folder format {version}; this version rewrites "
                         f"format {sorted(RECORD_FIELDS)} only")
    steps = range(version, FORMAT)
    touched = sorted({name for step in steps for name in RECORD_FIELDS[step]})
    for name in touched:
        if packed := packed_only(folder / name):
            raise ValueError(f"{packed} is gzipped and format {version} renames its fields; "
                             f"run `gunzip {packed}` first")
    files = {config_path: json.dumps(migrated_config(config, version), indent=2)}
    for name in (n for n in touched if (folder / n).exists()):
        records = read_jsonl(folder / name)
        for step in steps:
            records = [renamed(r, RECORD_FIELDS[step].get(name, {})) for r in records]
        files[folder / name] = jsonl_text(records)
    if (folder / "metrics.csv").exists() and "metrics.jsonl" in touched:
        rows = list(csv.reader(io.StringIO((folder / "metrics.csv").read_text())))
        for step in steps:
            names = RECORD_FIELDS[step].get("metrics.jsonl", {})
            rows[:1] = [[names.get(c, c) for c in rows[0]]] if rows else []
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        files[folder / "metrics.csv"] = text.getvalue()
    for path, text in files.items():  # every file read and rewritten text made before any write
        atomic_write(path, text)
    return f"{folder}: format {version} -> {FORMAT} ({', '.join(p.name for p in files)})"


def main(argv: list[str] | None = None) -> None:
    """Migrate each folder named on the command line under its lock."""
    parser = cli.Parser("python -m benchmarks.migrate", description=__doc__)
    parser.add_argument("folders", nargs="+", help="study folders written by an earlier version")
    args = parser.parse_args(argv)
    configure()
    for folder in args.folders:
        try:
            if not Path(folder).is_dir():
                raise ValueError(f"{folder!r} is not a folder")
            with RunLock(folder):
                print(migrate(folder))
        except (FolderBusy, ValueError, OSError) as err:
            parser.exit(2, f"{parser.prog}: error: {err}\n")


if __name__ == "__main__":
    main()
