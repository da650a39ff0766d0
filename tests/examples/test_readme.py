"""The README's Python examples run as written (the training one shrunk onto the toy model)."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import ToyTask

import cory_env

cory_env.register_task("toy", ToyTask)
README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_env_example_runs(capsys):
    (env_block,) = [b for b in BLOCKS if "cory_env.env(" in b]
    exec(compile(env_block, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip()  # it printed the transcript


def test_the_learner_example_trains_and_checkpoints(toy_lm, tmp_path, monkeypatch):
    (block,) = [b for b in BLOCKS if "Trainer(TrainConfig(" in b]
    shrunk = re.sub(r'TrainConfig\(task="sentiment", (method="cory"), iterations=20, '
                    r'batch_size=32\)', rf'TrainConfig(task="toy", \1, iterations=2, '
                    rf'batch_size=8, model={toy_lm!r})', block)
    assert shrunk != block, "the README's Trainer call changed: update this test"
    monkeypatch.chdir(tmp_path)
    exec(compile(shrunk, "README.md", "exec"), {})
    assert (tmp_path / "ckpt.pt").exists()


def test_the_first_exercises_snippet_runs_as_a_script_outside_the_repo(tmp_path):
    """Copied into a file and run from another folder, as a student would (its task is built
    in, so no import from the repo's examples is needed)."""
    import subprocess
    import sys

    docs = (Path(__file__).resolve().parents[2] / "docs" / "exercises.md").read_text()
    block = re.findall(r"```python\n(.*?)```", docs, re.S)[0]
    (tmp_path / "mine.py").write_text(block)
    out = subprocess.run([sys.executable, "mine.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'observer': {'reward': 1.0, 'copy_rate': 1.0}" in out.stdout
