"""The leaderboard: run a pre-stated plan's studies, then render docs/leaderboard.md from them.

    python -m benchmarks.leaderboard run docs/leaderboard/plan.toml --workers 2 --threads 1
    python -m benchmarks.leaderboard run docs/leaderboard/plan.toml --ray 127.0.0.1:6379
    python -m benchmarks.leaderboard status docs/leaderboard/plan.toml --workers 2
    python -m benchmarks.leaderboard render docs/leaderboard/plan.toml --out docs/leaderboard.md \
        --readme README.md
    python -m benchmarks.leaderboard check docs/leaderboard/plan.toml docs/leaderboard.md README.md
    python -m benchmarks.leaderboard render docs/leaderboard/plan.toml --out docs/leaderboard.md \
        --readme README.md --check     # the same check, spelled as the render it checks
    python -m benchmarks.leaderboard place docs/leaderboard/plan.toml runs/mine [--out mine.md]

`run` runs every study of the plan (`benchmarks.evidence.leaderboard` states its format), one
after another, each with `benchmarks.run --preset P --methods ... --out FOLDER` (and
`--resume` once its folder exists), so a stop at any point loses at most the iterations since
each run's last checkpoint: run it again and it continues. A study whose runs are all finished
is not started again, so its folder may keep its records gzipped. The first `run` pins the
code: it refuses a plan with uncommitted changes or a checkout whose code differs from its
commit, and writes `pin.json` (that commit and the plan's sha256) beside the plan. Every
later `run` refuses a plan edited since, and runs the pinned commit's code from a git worktree
(`.leaderboard/<commit>`) when the checkout has moved on, so every record names one commit.
`render` writes the page (and the README's block between its markers) and the profile plot
from the records, the same bytes for the same records; it refuses a plan whose runs are not
all finished unless `--partial`, which says how many are. `check` (or `render --check`)
renders again and compares the page and the README's block byte for byte, and the plot by the
digest of its curves, which the PNG carries (its pixels depend on matplotlib's version).
`place` ranks your methods' study folders, run with the plan's setting, beside the plan's
records (`benchmarks.evidence.placement`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.evidence.leaderboard import (
    Board,
    Entry,
    cpu_cost,
    entries,
    missing_runs,
    pinned,
    profiles,
    progress,
)
from benchmarks.evidence.placement import place
from benchmarks.evidence.plan import evaluate
from benchmarks.report.leaderboard import (
    PROFILE_PLOT,
    README_END,
    README_START,
    page,
    placement_page,
    plot_profiles,
    plotted_digest,
    profiles_digest,
    readme_block,
)
from benchmarks.why import render as hypotheses_table
from cory_common import cli
from cory_common.files import atomic_write, file_digest
from cory_common.threads import configure

ROOT = Path(__file__).resolve().parents[1]
EXECUTION = (("--workers", int, "runs at once on this machine"),
             ("--threads", int, "torch threads per run"),
             ("--ray", str, "a Ray cluster's address"),
             ("--storage", str, "a folder every Ray node reads and writes"))
CODE = ("agents", "benchmarks", "cory_common", "cory_env", "pyproject.toml")


def _git(*args: str, cwd: Path = ROOT) -> str:
    """A git command's output in the checkout (a ValueError naming it when git fails)."""
    out = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True)
    if out.returncode:
        raise ValueError(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


def code_changes(root: Path = ROOT) -> str:
    """The checkout's uncommitted changes to its code (empty when clean)."""
    return _git("status", "--porcelain", "--untracked-files=no", "--", *CODE, cwd=root)


def pin(board: Board) -> dict:
    """The commit and plan hash the runs are made under: read from pin.json, or (first run)
    checked and written: the plan committed and the code clean at HEAD."""
    folder, plan = board.path.parent, board.path
    saved = pinned(folder)
    if saved is not None:
        if saved["plan_sha256"] != file_digest(plan):
            raise ValueError(f"{plan} was edited after its runs began (sha256 "
                             f"{file_digest(plan)[:12]}, the runs' {saved['plan_sha256'][:12]} in "
                             f"{folder / 'pin.json'}): restore it (git checkout "
                             f"{saved['commit'][:12]} -- {plan}) or start a new plan")
        return saved
    where = plan.resolve().parent
    try:
        committed = not _git("status", "--porcelain", "--", plan.name, cwd=where) and \
            bool(_git("ls-files", plan.name, cwd=where))
    except ValueError:  # not in a git repository
        committed = False
    if not committed:
        raise ValueError(f"{plan} is not committed: a plan is committed before its first run")
    if code_changes():
        raise ValueError(f"the code has uncommitted changes ({', '.join(CODE)}): commit them "
                         f"first, so every record names one commit")
    saved = {"commit": _git("rev-parse", "HEAD"), "plan_sha256": file_digest(plan),
             "plan_commit": _git("log", "-1", "--format=%H", "--", plan.name, cwd=where)}
    atomic_write(folder / "pin.json", json.dumps(saved, indent=2) + "\n")
    return saved


def code_root(commit: str) -> Path:
    """Where the pinned commit's code is: this checkout while its code equals the commit's,
    else a worktree of the commit (made once, under .leaderboard/)."""
    if not code_changes() and not _git("diff", "--name-only", commit, "HEAD", "--", *CODE):
        return ROOT
    tree = ROOT / ".leaderboard" / commit[:12]
    if not (tree / ".git").exists():
        _git("worktree", "add", "--detach", str(tree), commit)
    return tree


def run(board: Board, execution: list[str], workers: int = 1) -> None:
    """Every study of the plan, each continued where it stopped (see the module docstring);
    `execution` is benchmarks.run's options, `workers` the runs they run at once."""
    saved = pin(board)
    root = code_root(saved["commit"])
    print(f"leaderboard {board.path}: code of {saved['commit'][:12]} from {root}; "
          f"{progress(board).line()}; {cpu_cost(board).line(workers)}", flush=True)
    for study in board.studies:
        if not study.unfinished(board.methods):
            print(f"leaderboard: {study.task} already finished", flush=True)
            continue
        out = (ROOT / study.folder).resolve()
        args = [sys.executable, "-m", "benchmarks.run", *study.run_args(board.methods),
                "--out", str(out), *execution]
        if (out / "run_config.json").exists():
            args.append("--resume")
        done = subprocess.run(args, cwd=root)
        if done.returncode:
            sys.exit(f"{study.task}: benchmarks.run stopped with exit status {done.returncode}; "
                     f"run this command again to continue")
        print(f"leaderboard: {study.task} finished; {progress(board).line()}", flush=True)


def render(board: Board, partial: bool, page_path: Path) -> tuple[str, str, list[Entry]]:
    """The page (to live at `page_path`), the README block and the table both show (a
    ValueError naming the missing runs unless partial)."""
    missing = missing_runs(board)
    if missing and not partial:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6
                                          else "")
        raise ValueError(f"{len(missing)} planned runs have not finished ({shown}): run "
                         f"`python -m benchmarks.leaderboard run {board.path}`, or render with "
                         f"--partial")
    cache: dict = {}  # the rows and the table read each folder once between them
    rows, table = evaluate(board.plan, cache), entries(board, cache)
    saved = pinned(board.path.parent)
    plot = board.path.parent / PROFILE_PLOT
    return (page(board, table, saved, hypotheses_table(board.plan, rows, str(board.path)), rows,
                 os.path.relpath(plot, page_path.parent)),
            readme_block(board, table, os.path.relpath(plot, ROOT)), table)


def with_block(text: str, block: str, where: Path) -> str:
    """`text` with its leaderboard block (between the markers) replaced by `block`."""
    if README_START not in text or README_END not in text:
        raise ValueError(f"{where} has no {README_START} ... {README_END} block")
    head, rest = text.split(README_START, 1)
    return head + block + rest.split(README_END, 1)[1]


def check(board: Board, doc: Path, readme: Path | None, partial: bool) -> list[str]:
    """What differs between the files (the page, the README's block, the profile plot's
    numbers) and a fresh rendering (empty: they agree)."""
    text, block, table = render(board, partial, doc)
    again = (f"python -m benchmarks.leaderboard render {board.path} --out {doc}"
             + (f" --readme {readme}" if readme else "") + (" --partial" if partial else ""))
    out = []
    if not doc.is_file() or doc.read_text() != text:
        out.append(f"{doc} differs from its rendering: {again}")
    if readme is not None:
        current = readme.read_text()
        if with_block(current, block, readme) != current:
            out.append(f"{readme}'s leaderboard block differs from its rendering: {again}")
    plot = board.path.parent / PROFILE_PLOT
    if plotted_digest(plot) != profiles_digest(profiles(table)):
        out.append(f"{plot} is not the plot of these records' profiles: {again}")
    return out


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run, report, render or check."""
    p = cli.Parser("python -m benchmarks.leaderboard", description=__doc__)
    p.add_argument("action", choices=("run", "status", "render", "check", "place"))
    p.add_argument("plan", help="the plan file (TOML with a [leaderboard] section)")
    p.add_argument("files", nargs="*", help="check: the page, then optionally the README; "
                   "place: study folders of your methods, run with the plan's setting")
    p.add_argument("--out", help="render or place: the page to write")
    p.add_argument("--readme", help="render: a README whose leaderboard block to rewrite")
    p.add_argument("--partial", action="store_true", help="render or check before every run "
                   "finished (the page says how many have)")
    p.add_argument("--check", action="store_true", help="render: write nothing, compare the "
                   "--out page, the --readme block and the plot with a fresh rendering (= check)")
    for flag, kind, text in EXECUTION:
        p.add_argument(flag, type=kind, help=f"run: {text} (benchmarks.run's option)")
    a = p.parse_args(argv)
    configure(a.threads)
    try:
        board = Board.load(a.plan)
        if a.action == "run":
            run(board, [x for flag, _, _ in EXECUTION
                        for v in [getattr(a, flag[2:])] if v is not None for x in (flag, str(v))],
                a.workers or 1)
        elif a.action == "place":
            cache: dict = {}
            placing = place(board, a.files, cache)
            text = placement_page(placing, entries(placing.board, cache),
                                  pinned(board.path.parent))
            if a.out:
                atomic_write(Path(a.out), text)
            else:
                print(text, end="")
        elif a.action == "status":
            print(progress(board).line())
            print(cpu_cost(board).line(a.workers or 1))
        elif a.action == "render" and not a.check:
            text, block, table = render(board, a.partial, Path(a.out or "docs/leaderboard.md"))
            plot_profiles(table, board.path.parent / PROFILE_PLOT)
            if a.out:
                atomic_write(Path(a.out), text)
            else:
                print(text, end="")
            if a.readme:
                path = Path(a.readme)
                atomic_write(path, with_block(path.read_text(), block, path))
        else:
            files = a.files or ([a.out or "docs/leaderboard.md"] + ([a.readme] if a.readme else [])
                                if a.action == "render" else [])
            if not files:
                p.error("check needs the page (and optionally the README)")
            problems = check(board, Path(files[0]), Path(files[1]) if len(files) > 1 else None,
                             a.partial)
            if problems:
                sys.exit("\n".join(problems))
            print(f"{files[0]}{', ' + files[1] if len(files) > 1 else ''} and the profile plot "
                  f"match their rendering")
    except ValueError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
