"""The version says what changed: the changelog's newest entry is the package's version, and it
names every study-folder and checkpoint format this version reads."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_the_newest_changelog_entry_is_the_packages_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.findall(r"^## (\d+\.\d+\.\d+) ", text, re.M)[0] == version


def test_the_changelog_names_the_formats_this_version_writes():
    from agents.training.checkpoint import FORMAT as CHECKPOINT
    from benchmarks.evidence.records import FORMAT as FOLDER

    text = (ROOT / "CHANGELOG.md").read_text()
    folders = text.split("### Study folders")[1].split("###")[0]
    checkpoints = text.split("### Checkpoints")[1].split("###")[0]
    assert re.search(rf"^\| {FOLDER} \| ", folders, re.M), FOLDER
    assert re.search(rf"^\| {CHECKPOINT} \| ", checkpoints, re.M), CHECKPOINT
