"""The coordinator of a study: the one path from a setting to a finished study folder.

    run_benchmark(cfg, "runs/smoke")                # every run of cfg, then report.md
    run_benchmark(cfg, "runs/smoke", resume=True)   # continue it after a kill

It locks the folder (`benchmarks.study.folder.StudyFolder`), starts or resumes it, fills its
mechanism.json (`benchmarks.study.mechanism`), hands the runs left to an executor
(`benchmarks.study.executors`) whose messages the recorder writes
(`benchmarks.study.recorder`), and writes the report (`benchmarks.report`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from benchmarks.report.markdown import write_report
from benchmarks.settings.config import BenchConfig, check_resume, run_specs
from benchmarks.study.executors import Execution, make_executor
from benchmarks.study.folder import StudyFolder
from benchmarks.study.mechanism import refresh_mechanism
from benchmarks.study.progress import Progress
from benchmarks.study.recorder import canonical_order, run_study
from cory_common.files import remove_dir, remove_orphans
from cory_common.runlog import RunLock
from cory_common.threads import thread_setting


class StudyFailed(RuntimeError):
    """Runs of a study failed on their workers (the others finished; the report is written)."""


def run_benchmark(cfg: BenchConfig, out: str | os.PathLike, resume: bool = False,
                  progress: bool = True, stop_after: int | None = None,
                  allow_changed_code: bool = False, execution: Execution | None = None) -> Path:
    """Run (or resume) every run of cfg in folder `out`, then write plots and report.md.

    The folder is locked for the whole call (a second writer gets FolderBusy); this process
    writes every file of it, wherever the runs execute (`execution`: this process, local
    workers or a Ray cluster). A fresh run that fails before its first record leaves nothing
    behind. Runs that fail on their workers are named by StudyFailed once the others are done
    and the report is written. `stop_after` (testing): stop every run after that many
    iterations, as a kill would.
    """
    execution = (execution or Execution()).check(cfg.threads, cfg.wandb)
    folder = StudyFolder(out)
    existed = folder.path.exists()
    before = set(folder.path.iterdir()) if existed else set()
    lock = RunLock(folder.path).acquire()
    try:
        return _run_all(cfg, folder, resume, progress, stop_after, allow_changed_code, execution)
    except BaseException:
        if not resume and not folder.metrics.exists():  # a failed start: undo it
            lock.release()
            if not existed:
                remove_dir(folder.path)
            for p in set(folder.path.iterdir()) - before if existed else ():
                remove_dir(p) if p.is_dir() else p.unlink(missing_ok=True)
        raise
    finally:
        lock.release()


def _run_all(cfg: BenchConfig, folder: StudyFolder, resume: bool, progress: bool,
             stop_after: int | None, allow_changed_code: bool, execution: Execution) -> Path:
    """run_benchmark's body (under the folder's lock): runs not yet done, then the report."""
    if resume:
        saved = folder.saved_config()
        check_resume(cfg, saved)
        folder.check_code(cfg, allow_changed_code)
        folder.check_records()
        folder.grow(cfg, saved)
    else:
        folder.start(cfg)
    for orphan in remove_orphans(folder.path):
        folder.log(f"removed {orphan.relative_to(folder.path)}, left by an interrupted save")
    refresh_mechanism(cfg, folder)
    specs = run_specs(cfg)
    todo = [s for s in specs if not folder.done_marker(s).exists()]
    executor = make_executor(execution, cfg.threads, gpus=1.0 if cfg.train.device.startswith("cuda")
                         else 0.0)
    bar = Progress(cfg, specs, executor.capacity, enabled=progress)
    for spec in specs:
        if spec not in todo:
            bar.finished(spec.key)
    if executor.ckpt_dir is None and execution.ray is None:  # this machine: the folder itself
        executor.ckpt_dir = str(folder.path / "ckpt")
        (folder.path / "ckpt").mkdir(parents=True, exist_ok=True)
    folder.log(f"{'resuming' if resume else 'starting'} {len(specs)} runs ({len(todo)} to run"
               f"{_where(execution, cfg.threads)}; {thread_setting(cfg.threads)})")
    if cfg.kl_coef_sweep:  # the grid every task runs, as recorded in run_config.json
        grid = ", ".join(f"{c:g}" for c in cfg.kl_coef_sweep)
        folder.log(f"KL-coefficient sweep: {grid} (fixed, on every task)")
        print(f"KL-coefficient sweep: {grid} (fixed, on every task)", file=sys.stderr)
    failed = run_study(cfg, folder, todo, executor, bar, stop_after,
                       wandb=bool(cfg.wandb) and execution.workers == 1)
    bar.close()
    if failed and not folder.metrics.exists():  # nothing ran: no report, the start undone
        raise StudyFailed(_failures(failed, folder))
    canonical_order(folder, specs)
    finished = all(folder.done_marker(s).exists() for s in specs)
    path = write_report(folder.path)
    folder.log(f"report written ({'complete' if finished else 'partial'})")
    if failed:
        raise StudyFailed(_failures(failed, folder) + "; the others finished and the report is "
                          "written; --resume runs the failed ones again")
    return path


def _failures(failed: dict[str, str], folder: StudyFolder) -> str:
    """Each failed run's traceback on stderr; the one-line summary naming them."""
    for key, why in failed.items():
        print(f"{key} failed:\n{why}", file=sys.stderr)
    last = next(iter(failed.values())).strip().splitlines()[-1]
    return (f"{len(failed)} run(s) failed: {', '.join(failed)} ({last}; tracebacks above and "
            f"in {folder.path / 'log.txt'})")


def _where(execution: Execution, threads: int) -> str:
    """', on N workers of T threads' for the log line (nothing for this process)."""
    if execution.ray is not None:
        return f", on Ray at {execution.ray}, {max(threads, 1)} CPU(s) a run"
    if execution.workers > 1:
        return f", {execution.workers} at once, {max(threads, 1)} thread(s) each"
    return ""
