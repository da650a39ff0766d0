"""A run folder of format 4 is rewritten once to the names of format 5, values unchanged."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from benchmarks import migrate
from benchmarks.records import RunData

PUBLISHED = Path(__file__).resolve().parents[2] / "docs/fidelity/tiny"


def as_format_4(folder: Path) -> None:
    """Write a format-5 folder back in format 4's names (the inverse of the migration)."""
    back = {new: old for old, new in migrate.RECORD_FIELDS[4].items()}
    for name in ("metrics.jsonl", "alone.jsonl"):
        lines = (folder / name).read_text().splitlines()
        (folder / name).write_text("".join(
            json.dumps(migrate.renamed(json.loads(line), back)) + "\n" for line in lines))
    config = json.loads((folder / "run_config.json").read_text())
    config["format"] = 4
    config = json.loads(json.dumps(config).replace('"kl_coef_sweep"', '"eta_sweep"')
                        .replace('"report_kl_coef"', '"eta"').replace('"coef"', '"beta"'))
    (folder / "run_config.json").write_text(json.dumps(config, indent=2))


def test_a_format_4_folder_is_migrated_once_to_the_published_records(tmp_path, capsys):
    folder = tmp_path / "tiny"
    shutil.copytree(PUBLISHED, folder)
    as_format_4(folder)
    with pytest.raises(ValueError, match=r"format 4 .*python -m benchmarks.migrate .*tiny"):
        RunData.load(folder)
    migrate.main([str(folder)])
    assert "format 4 -> 5" in capsys.readouterr().out
    for name in ("metrics.jsonl", "alone.jsonl", "run_config.json"):
        assert (folder / name).read_text() == (PUBLISHED / name).read_text(), name
    migrate.main([str(folder)])  # once: a second pass leaves it as it is
    assert "already format 5" in capsys.readouterr().out
    assert RunData.load(folder).rows == RunData.load(PUBLISHED).rows


def test_migrate_names_what_it_cannot_rewrite(tmp_path, capsys):
    for argv, message in (([str(tmp_path / "nowhere")], "is not a folder"),
                          ([str(tmp_path)], "holds no run records")):
        with pytest.raises(SystemExit):
            migrate.main(argv)
        assert message in capsys.readouterr().err
    (tmp_path / "run_config.json").write_text(json.dumps({"format": 3}))
    with pytest.raises(SystemExit):
        migrate.main([str(tmp_path)])
    assert "format 3; this version rewrites format [4] only" in capsys.readouterr().err


def test_migrate_refuses_gzipped_records_and_writes_nothing(tmp_path, capsys):
    folder = tmp_path / "tiny"
    shutil.copytree(PUBLISHED, folder)
    as_format_4(folder)
    plain = folder / "metrics.jsonl"
    (folder / "metrics.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit):
        migrate.main([str(folder)])
    assert f"gunzip {folder / 'metrics.jsonl.gz'}" in capsys.readouterr().err
    after = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before
