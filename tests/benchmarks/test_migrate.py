"""A study folder of an earlier format (4 or 5) is rewritten once to this version's names, values
unchanged."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from benchmarks import migrate
from benchmarks.evidence.records import FORMAT, RunData

PUBLISHED = Path(__file__).resolve().parents[2] / "docs/fidelity/tiny"


def as_format(folder: Path, version: int) -> None:
    """Write a folder of this version back in `version`'s names (the inverse of migrating)."""
    for step in reversed(range(version, FORMAT)):
        for name, names in migrate.RECORD_FIELDS[step].items():
            back = {new: old for old, new in names.items()}
            lines = (folder / name).read_text().splitlines()
            (folder / name).write_text("".join(
                json.dumps(migrate.renamed(json.loads(line), back)) + "\n" for line in lines))
    config = json.loads((folder / "run_config.json").read_text())
    config["format"] = version
    if version == 4:
        config = json.loads(json.dumps(config).replace('"kl_coef_sweep"', '"eta_sweep"')
                            .replace('"report_kl_coef"', '"eta"').replace('"coef"', '"beta"'))
    (folder / "run_config.json").write_text(json.dumps(config, indent=2))


@pytest.mark.parametrize("version", [4, 5])
def test_an_older_folder_is_migrated_once_to_the_published_records(tmp_path, capsys, version):
    folder = tmp_path / "tiny"
    shutil.copytree(PUBLISHED, folder)
    as_format(folder, version)
    with pytest.raises(ValueError, match=rf"format {version} .*benchmarks.migrate .*tiny"):
        RunData.load(folder)
    migrate.main([str(folder)])
    assert f"format {version} -> {FORMAT}" in capsys.readouterr().out
    for name in ("metrics.jsonl", "alone.jsonl", "run_config.json"):
        assert (folder / name).read_text() == (PUBLISHED / name).read_text(), name
    migrate.main([str(folder)])  # once: a second pass leaves it as it is
    assert f"already format {FORMAT}" in capsys.readouterr().out
    assert RunData.load(folder).rows == RunData.load(PUBLISHED).rows
    assert RunData.load(folder).evals == RunData.load(PUBLISHED).evals


def test_a_format_5_folder_keeps_its_gzipped_training_records(tmp_path, capsys):
    """5 -> 6 renames a field of alone.jsonl only: metrics.jsonl.gz stays as it is."""
    folder = tmp_path / "tiny"
    shutil.copytree(PUBLISHED, folder)
    as_format(folder, 5)
    plain = folder / "metrics.jsonl"
    packed = gzip.compress(plain.read_bytes(), mtime=0)
    (folder / "metrics.jsonl.gz").write_bytes(packed)
    plain.unlink()
    migrate.main([str(folder)])
    assert (folder / "metrics.jsonl.gz").read_bytes() == packed
    assert (folder / "alone.jsonl").read_text() == (PUBLISHED / "alone.jsonl").read_text()


def test_migrate_names_what_it_cannot_rewrite(tmp_path, capsys):
    for argv, message in (([str(tmp_path / "nowhere")], "is not a folder"),
                          ([str(tmp_path)], "holds no run records")):
        with pytest.raises(SystemExit):
            migrate.main(argv)
        assert message in capsys.readouterr().err
    (tmp_path / "run_config.json").write_text(json.dumps({"format": 3}))
    with pytest.raises(SystemExit):
        migrate.main([str(tmp_path)])
    assert "format 3; this version rewrites format [4, 5] only" in capsys.readouterr().err


def test_migrate_refuses_gzipped_records_and_writes_nothing(tmp_path, capsys):
    folder = tmp_path / "tiny"
    shutil.copytree(PUBLISHED, folder)
    as_format(folder, 4)
    plain = folder / "metrics.jsonl"
    (folder / "metrics.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit):
        migrate.main([str(folder)])
    assert f"gunzip {folder / 'metrics.jsonl.gz'}" in capsys.readouterr().err
    after = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before
