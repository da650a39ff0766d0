"""Rewrite a run folder of an earlier format once, in place, to the format this version reads.

    python -m benchmarks.migrate runs/X [runs/Y ...]

Format 5 gave the KL coefficient one name: records' `beta` is `kl_coef`, `eta` (the weight of
the reported combined reward) is `report_kl_coef`, `sweep_eta` is `swept_kl_coef`; settings'
`eta_sweep` is `kl_coef_sweep`, `train.eta` is `train.report_kl_coef`, `train.ppo.kl.beta` is
`train.ppo.kl.coef`. Values are unchanged. Every file is checked and rewritten under the
folder's lock, each atomically; a folder already at format 5 is left as it is. Checkpoints are
not rewritten: a migrated folder reports, re-renders and grows (`--resume --seeds`), but an
unfinished run of it restarts from its first iteration.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from agents.training.runlog import FolderBusy, RunLock, jsonl_text, read_jsonl
from cory_common import cli
from cory_common.files import atomic_write
from cory_common.threads import configure

from .records import FORMAT, gzipped_records, no_records

RECORD_FIELDS = {4: {"beta": "kl_coef", "eta": "report_kl_coef", "sweep_eta": "swept_kl_coef"}}
SETTINGS = {4: {("eta_sweep",): ("kl_coef_sweep",), ("train", "eta"): ("train", "report_kl_coef"),
                ("train", "ppo", "kl", "beta"): ("train", "ppo", "kl", "coef")}}


def renamed(record: dict, names: dict[str, str]) -> dict:
    """The record with its fields renamed, in the same order."""
    return {names.get(k, k): v for k, v in record.items()}


def migrated_config(config: dict, version: int) -> dict:
    """run_config.json's contents with the settings renamed since `version` (each in its
    place), at FORMAT."""
    def walk(node: dict, path: tuple) -> dict:
        return {SETTINGS[version].get((*path, k), (*path, k))[-1]:
                walk(v, (*path, k)) if isinstance(v, dict) else v for k, v in node.items()}

    return {**walk(config, ()), "format": FORMAT}


def migrate(folder: str | os.PathLike) -> str:
    """Rewrite one run folder to FORMAT; returns what was done, raises ValueError naming what
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
        raise ValueError(f"{folder} is run-folder format {version}; this version rewrites "
                         f"format {sorted(RECORD_FIELDS)} only")
    if why := gzipped_records(folder):
        raise ValueError(why)
    names = RECORD_FIELDS[version]
    files = {config_path: json.dumps(migrated_config(config, version), indent=2)}
    for name in ("metrics.jsonl", "alone.jsonl"):
        if (folder / name).exists():
            files[folder / name] = jsonl_text(renamed(r, names) for r in read_jsonl(folder / name))
    if (folder / "metrics.csv").exists():
        rows = list(csv.reader(io.StringIO((folder / "metrics.csv").read_text())))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([[names.get(c, c) for c in rows[0]],
                                                        *rows[1:]] if rows else [])
        files[folder / "metrics.csv"] = text.getvalue()
    for path, text in files.items():  # every file read and rewritten text made before any write
        atomic_write(path, text)
    return f"{folder}: format {version} -> {FORMAT} ({', '.join(p.name for p in files)})"


def main(argv: list[str] | None = None) -> None:
    """Migrate each folder named on the command line under its lock."""
    parser = cli.Parser("python -m benchmarks.migrate", description=__doc__)
    parser.add_argument("folders", nargs="+", help="run folders written by an earlier version")
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
