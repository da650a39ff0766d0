"""A damaged record is never dropped without a word: every reader of a study folder (resume,
report, compare, why's records, merge) refuses it naming the file and the line, in a finished
folder and an unfinished one alike, and writes nothing."""

from __future__ import annotations

import gzip
import json
import shutil
import warnings
from pathlib import Path

import pytest

from benchmarks import merge
from benchmarks.compare import main as compare_main
from benchmarks.evidence.records import RunData
from benchmarks.report.markdown import main as report_main
from benchmarks.run import main as run_main
from cory_common.runlog import LedgerError, read_jsonl

PUBLISHED = Path(__file__).resolve().parents[2] / "docs/fidelity/tiny"
DAMAGE = {  # what replaces line 5 of the file
    "not JSON": "{\"task\": \"sentiment\", \"method\": ",
    "not an object": "[1, 2, 3]",
}


def damaged(tmp_path: Path, name: str, damage: str, finished: bool) -> tuple[Path, int]:
    """A copy of the published folder with line 5 of `name` damaged (and, unfinished, one run
    not marked done); returns it and the damaged line's number."""
    folder = tmp_path / "study"
    shutil.copytree(PUBLISHED, folder)
    lines = (folder / name).read_text().splitlines(keepends=True)
    lines[4] = DAMAGE[damage] + "\n"
    (folder / name).write_text("".join(lines))
    if not finished:
        next((folder / "done").iterdir()).unlink()
    return folder, 5


def files_of(folder: Path) -> dict[Path, bytes]:
    """Every file's bytes (the lock's own files aside)."""
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and ".lock" not in p.name}


@pytest.mark.parametrize("finished", [True, False], ids=["finished", "unfinished"])
@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("name", ["metrics.jsonl", "alone.jsonl"])
def test_every_reader_names_a_damaged_record(tmp_path, capsys, name, damage, finished):
    folder, line = damaged(tmp_path, name, damage, finished)
    where = f"{folder / name}, line {line}"
    before = files_of(folder)
    with pytest.raises(LedgerError, match=rf"line {line}: not a JSON"):
        RunData.load(folder)  # what benchmarks.why and the report read
    with pytest.raises(SystemExit):
        run_main(["--resume", "--out", str(folder), "--no-progress"])
    assert where in capsys.readouterr().err
    with pytest.raises(SystemExit) as report_exit:
        report_main([str(folder)])
    assert where in str(report_exit.value) + capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare_main([str(PUBLISHED), str(folder), "--same"])
    assert where in capsys.readouterr().err
    with pytest.raises(SystemExit):
        merge.main([str(folder), "--out", str(tmp_path / "merged")])
    assert where in capsys.readouterr().err and not (tmp_path / "merged").exists()
    assert files_of(folder) == before  # nothing rewritten, nothing dropped


def test_a_gzipped_record_file_is_read_as_strictly(tmp_path):
    path = tmp_path / "metrics.jsonl"
    text = (PUBLISHED / "metrics.jsonl").read_text().splitlines(keepends=True)
    text[2] = "oops\n"
    (tmp_path / "metrics.jsonl.gz").write_bytes(gzip.compress("".join(text).encode()))
    with pytest.raises(LedgerError, match=r"metrics.jsonl.gz, line 3: not a JSON record"):
        read_jsonl(path)


def test_only_a_torn_last_line_is_left_out_and_it_is_named(tmp_path):
    """A write in progress (or cut by a kill) leaves a last line without its newline: readers
    leave it out with a warning naming it; the same text with a newline after it is damage."""
    path = tmp_path / "alone.jsonl"
    good = (PUBLISHED / "alone.jsonl").read_text()
    path.write_text(good + json.dumps({"task": "sentiment"})[:9])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_jsonl(path)
    assert len(records) == len(good.splitlines())
    assert any(f"{path}, line {len(records) + 1}: a torn last record" in str(w.message)
               for w in caught)
    path.write_text(path.read_text() + "\n")
    with pytest.raises(LedgerError, match=rf"line {len(records) + 1}: not a JSON record"):
        read_jsonl(path)
