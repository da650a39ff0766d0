"""Your methods on the leaderboard: study folders run with a plan's setting, read beside the
plan's own records and ranked with them (`python -m benchmarks.leaderboard place`).

    python -m benchmarks.run --preset leaderboard --tasks reviews --methods my-learner \\
        --import ./my_learner.py --out runs/mine
    python -m benchmarks.leaderboard place docs/leaderboard/plan.toml runs/mine

A folder is placed on each of its tasks the plan has a study of, when its settings are that
study's: the methods, seeds, tasks, `--import` code, threads, device, checkpoint interval and
preset name may differ; any other setting is refused by name. Its methods must be new to the
board. The board is then read over the tasks the folders cover, so every method is aggregated
over the same tasks, and only finished runs count. The plan's hypotheses do not name a placed
method, so its comparison is descriptive: intervals, no verdict.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agents.training.checkpoint import config_differences, run_config
from benchmarks.evidence.leaderboard import Board
from benchmarks.evidence.plan import made_with, run_data, trajectories
from benchmarks.evidence.records import check_format
from benchmarks.settings.config import from_saved

MAY_DIFFER = ("methods", "seeds", "tasks", "imports", "threads", "wandb", "preset", "quick",
              "checkpoint_every", "train.device", "train.placement")  # what a run may vary


@dataclass(frozen=True)
class Placement:
    """The board read over the placed folders' tasks with their methods added (`board`), the
    plan's own board (`origin`), and what each placed method's records name."""

    board: Board
    origin: Board
    methods: tuple[str, ...]
    commits: dict[str, list[str]]  # placed method -> the commits its finished runs name

    @property
    def folders(self) -> dict[str, list[str]]:
        """placed method -> the folders it is read from."""
        return {m: sorted({f for _, x, f in self.board.placed if x == m}) for m in self.methods}


def settings(folder: Path) -> dict[str, object]:
    """A study folder's settings by dotted name, validated with its `--import` plug-ins loaded
    (a ValueError naming the folder)."""
    path = folder / "run_config.json"
    if not path.is_file():
        raise ValueError(f"{folder} holds no study (no run_config.json)")
    saved = json.loads(path.read_text())
    check_format(saved, path)
    try:  # validating imports the folder's plug-ins, so their methods read as any other
        return run_config(from_saved({k: v for k, v in saved.items()
                                      if k not in ("code", "format")}).validate())
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from None


def place(board: Board, folders: Sequence[str | Path], cache: dict | None = None) -> Placement:
    """The board with the methods of `folders` placed on it (a ValueError naming the first
    folder, task, setting or method that cannot be; records read through `cache`)."""
    if not folders:
        raise ValueError("place needs one study folder or more")
    studies = {s.task: s for s in board.studies}
    placed: dict[tuple[str, str], Path] = {}
    for folder in map(Path, folders):
        yours = settings(folder)
        tasks = [t for t in yours["tasks"] if t in studies]
        if not tasks:
            raise ValueError(f"{folder} runs {yours['tasks']}; the plan has studies of "
                             f"{list(studies)} only")
        for method in yours["methods"]:
            if method in board.methods:
                raise ValueError(f"{folder}: {method!r} is on the board already; place only "
                                 f"methods it does not hold (python -m benchmarks.compare "
                                 f"compares two folders' runs of one method)")
        for task in tasks:
            study = Path(studies[task].folder)
            if not (study / "run_config.json").is_file():
                raise ValueError(f"the plan's {task} study ({study}) has no runs yet to place "
                                 f"{folder} beside")
            diff, _ = config_differences(settings(study), yours, MAY_DIFFER,
                                         label=f"{folder}'s", base="the plan's")
            if diff:
                raise ValueError(f"{folder} was not run with the setting of the plan's {task} "
                                 f"study ({study}): " + "; ".join(diff))
            for method in yours["methods"]:
                if (task, method) in placed:
                    raise ValueError(f"{method!r} on {task} is in both {placed[task, method]} "
                                     f"and {folder}: merge them first (python -m "
                                     f"benchmarks.merge)")
                placed[task, method] = folder
    methods = tuple(dict.fromkeys(m for _, m in placed))
    covered = {t for t, _ in placed}
    read = dataclasses.replace(
        board, methods=board.methods + methods,
        studies=tuple(s for s in board.studies if s.task in covered),
        placed=tuple((t, m, str(f)) for (t, m), f in placed.items()))
    return Placement(read, board, methods, _commits(read, methods, {} if cache is None else cache))


def _commits(board: Board, methods: tuple[str, ...], cache: dict) -> dict[str, list[str]]:
    """placed method -> the commits its finished runs' records name."""
    out: dict[str, set[str]] = {m: set() for m in methods}
    for s in board.studies:
        for m in methods:
            arm = board.arm(s, m)
            seeds = set(trajectories(arm, cache))
            if seeds:
                data = run_data(arm.folder, cache)
                out[m].update(made_with(data, arm, "commit", seeds))
    return {m: sorted(v) for m, v in out.items()}


__all__ = ["MAY_DIFFER", "Placement", "place", "settings"]
