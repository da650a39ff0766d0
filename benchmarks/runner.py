"""The benchmark driver: run folders, records, resume bookkeeping and the progress bar.

    run_benchmark(cfg, "runs/smoke")                # every run of cfg, then report.md
    run_benchmark(cfg, "runs/smoke", resume=True)   # continue it after a kill

`RunFolder` owns the folder's files (see the `benchmarks` docstring): each iteration appends
to metrics.jsonl/metrics.csv and TensorBoard, then checkpoints; a resumed run reloads the
checkpoint and drops what was written after it.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import sys
import time
from pathlib import Path

from agents.refmodels import reference_lm
from agents.training.config import TrainConfig
from agents.training.runlog import (
    RunLock,
    append_jsonl,
    changed_code,
    code_identity,
    read_jsonl,
    resume_ledger,
)
from cory_common.files import atomic_write, remove_dir, remove_orphans
from cory_common.pretrained import resolve_model
from cory_common.threads import thread_setting
from cory_env import offline_model

from .config import (
    GROWABLE,
    BenchConfig,
    RunSpec,
    check_resume,
    from_saved,
    run_specs,
    train_config,
)
from .engines import Execution, make_engine
from .progress import Progress
from .records import FORMAT, check_format, gzipped_records, read_json
from .study import canonical_order, run_study
from .transfer import measure_transfer
from .transfer_read import budget_differences, saved_transfer, training_budget, transfer_file

ID_COLUMNS = ("task", "method", "seed", "swept_kl_coef", "run", "iteration", "agent", "role",
              "position", "rotation")
CSV_COLUMNS = ID_COLUMNS + (
    "task_reward", "task_reward_std", "kl", "combined_reward", "report_kl_coef", "kl_coef",
    "collective_reward", "copy_rate", "distinct_1", "distinct_2", "repetition_rate",
    "response_length", "value_loss", "policy_loss", "loss", "clipfrac", "value_clipfrac",
    "approx_kl", "entropy", "ratio_mean", "grad_norm", "kl_loss", "sampled_neg_logprob",
    "optimizer_steps", "epochs_run", "skipped_batches", "time_rollout_s", "time_update_s")
class RunFolder:
    """The files of a benchmark run folder (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.metrics = self.path / "metrics.jsonl"
        self.csv = self.path / "metrics.csv"
        self.evals = self.path / "alone.jsonl"
        self.config = self.path / "run_config.json"
        self.mechanism = self.path / "mechanism.json"

    def ckpt(self, spec: RunSpec) -> Path:
        """The run's checkpoint file."""
        return self.path / "ckpt" / f"{spec.key}.pt"

    def done_marker(self, spec: RunSpec) -> Path:
        """The file that marks a finished (trained and evaluated) run."""
        return self.path / "done" / spec.key

    def start(self, cfg: BenchConfig) -> None:
        """A new run folder: refuse to reuse one, write run_config.json."""
        if self.config.exists():
            raise ValueError(f"run folder {self.path} already holds a run; pass --resume to "
                             "continue it or choose another --out")
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.config, json.dumps({"format": FORMAT, **dataclasses.asdict(cfg),
                                              "code": code_identity(cfg.imports)}, indent=2))

    def grow(self, cfg: BenchConfig, saved: BenchConfig) -> None:
        """Record the seeds and methods a resume adds in run_config.json (its code kept)."""
        added = {name: [v for v in getattr(cfg, name) if v not in getattr(saved, name)]
                 for name in GROWABLE}
        if not any(added.values()):
            return
        data = json.loads(self.config.read_text())
        atomic_write(self.config, json.dumps({**data, "seeds": cfg.seeds, "methods": cfg.methods},
                                             indent=2))
        self.log("resume adds " + ", ".join(f"{name} {values}" for name, values in added.items()
                                            if values))

    def check_code(self, cfg: BenchConfig, allow_changed: bool) -> None:
        """Refuse a resume whose --import files changed since the run started (unless
        allowed, then log it)."""
        saved = read_json(self.config).get("code") or {}
        changed = changed_code(saved, code_identity(cfg.imports))
        if changed and not allow_changed:
            raise ValueError("--resume: " + "; ".join(changed) + ". Resuming would mix two "
                             "versions of the code in one run: restore the file, start a new "
                             "run folder, or pass --allow-changed-code")
        for message in changed:
            self.log(f"resumed with changed code (--allow-changed-code): {message}")

    def saved_config(self) -> BenchConfig:
        """The settings the folder's run was started with."""
        if not self.config.exists():
            raise ValueError(f"--resume: {self.config} not found; nothing to resume")
        if why := gzipped_records(self.path):
            raise ValueError(f"--resume: {why} (a resume would start a new file that hides it)")
        saved = read_json(self.config)
        saved.pop("code", None)
        check_format(saved, f"--resume: {self.config}")
        saved.pop("format")
        try:
            return from_saved(saved)
        except (TypeError, ValueError) as err:
            raise ValueError(f"--resume: {self.config}: {err}") from None

    def log(self, message: str) -> None:
        """Append a timestamped line to log.txt."""
        with open(self.path / "log.txt", "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")

    def append(self, records: list[dict]) -> None:
        """Append metric records to the JSONL and the CSV, flushed to disk."""
        append_jsonl(self.metrics, records)
        new = not self.csv.exists()
        with open(self.csv, "a", newline="", encoding="utf-8") as f:
            if new:
                f.write(_csv_text([]))
            f.write(_csv_text(records, header=False))
            f.flush()
            os.fsync(f.fileno())

    def truncate(self, spec: RunSpec, iteration: int) -> int:
        """Verify the run's records before `iteration` (LedgerError names the first bad line),
        drop those from `iteration` on and a torn line; make the CSV match."""
        dropped = resume_ledger(self.metrics, {"run": spec.key}, iteration)
        self.sync_csv()
        return dropped

    def sync_csv(self) -> None:
        """Make metrics.csv hold what metrics.jsonl holds, in its order."""
        text = _csv_text(read_jsonl(self.metrics))
        if not self.csv.exists() or self.csv.read_text(encoding="utf-8") != text:
            atomic_write(self.csv, text)

    def has_eval(self, run: str, iteration: int) -> bool:
        """Whether alone.jsonl holds the run's evaluation at that iteration."""
        return any(r.get("run") == run and r.get("iteration") == iteration
                   for r in read_jsonl(self.evals))

    def truncate_evals(self, spec: RunSpec, iteration: int) -> int:
        """Drop the run's evaluations after `iteration` (written after its checkpoint)."""
        return resume_ledger(self.evals, {"run": spec.key}, iteration + 1, complete=False)

    def add_evals(self, records: list[dict]) -> None:
        """Append evaluation records."""
        append_jsonl(self.evals, records)


def _csv_text(records: list[dict], header: bool = True) -> str:
    """CSV_COLUMNS of the records as CSV text (with the header line unless told not to)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows(records)
    return buffer.getvalue()


def mechanism(cfg: BenchConfig, folder: RunFolder, tasks: list[str] | None = None) -> dict:
    """Per task (default: every task of cfg), the model's knowledge and cross-role transfer
    (`benchmarks.transfer`): measured once per offline reference LM (about 4 minutes,
    then cached in its folder)."""
    out = {}
    for task in cfg.tasks if tasks is None else tasks:
        model = cfg.model_for(task)
        if model is not None or offline_model(task) is None:
            out[task] = saved_mechanism(cfg, folder, task)
            continue
        path = reference_lm(offline_model(task))
        saved = saved_transfer(path)
        if saved is None and cfg.quick:
            out[task] = {"not_measured": f"a quick run does not measure it (python -m "
                                         f"benchmarks.mechanism --measure {task})"}
            continue
        if saved is None:
            folder.log(f"{task}: measuring the model's knowledge and cross-role transfer")
            saved = measure_transfer(task, cfg=TrainConfig(device=cfg.train.device),
                                     progress=folder.log)
        out[task] = saved
    return out


def refresh_mechanism(cfg: BenchConfig, folder: RunFolder) -> None:
    """Write the folder's mechanism.json once; on resume, fill in a task "not measured" before
    whose measurement has since been saved (in the folder or beside its model), or say anew why
    it is still not, and follow a new measurement saved in the folder itself."""
    if not folder.mechanism.exists():
        atomic_write(folder.mechanism, json.dumps(mechanism(cfg, folder), indent=2))
        return
    old = json.loads(folder.mechanism.read_text())
    missing = [t for t, m in old.items() if "not_measured" in m]
    own = [t for t in old if t not in missing and transfer_file(folder.path, t).exists()]
    fresh = mechanism(cfg, folder, missing + own) if missing or own else {}
    changed = {t: m for t, m in fresh.items()
               if m != old[t] and (t in missing or "not_measured" not in m)}
    filled = [t for t, m in changed.items() if "not_measured" not in m]
    if filled:
        folder.log("mechanism.json: filled in " + ", ".join(filled))
    if changed:
        atomic_write(folder.mechanism, json.dumps({**old, **changed}, indent=2))


def saved_mechanism(cfg: BenchConfig, folder: RunFolder, task: str) -> dict:
    """A measurement of a named model at this run's budget: the run folder's
    transfer-<task>.json, else the one `benchmarks.mechanism --measure` saved beside the model;
    one at another budget (LoRA or not, lr, iterations, ...) is not used, and the answer says
    why (and how to measure it from what this folder has)."""
    model = cfg.model_for(task)
    run = training_budget(train_config(cfg, RunSpec(task, "ppo", cfg.seeds[0])))
    own = transfer_file(folder.path, task)
    beside = resolve_model(model) if model else None
    files = [own] + ([transfer_file(beside, task)] if beside and Path(beside).is_dir() else [])
    other = []
    for file in (f for f in files if f.exists()):
        measured = json.loads(file.read_text())
        differ = budget_differences(measured.get("budget", {}), run)
        if not differ:
            return measured
        other.append(f"{file} was measured at another budget ({'; '.join(differ)})")
    has = {m for m in ("ppo", "cory-no-re") if m in cfg.methods}
    if has == {"ppo", "cory-no-re"}:
        how = (f"measure it at this run's budget with python -m benchmarks.mechanism --measure "
               f"{task} --ppo-checkpoints ... --observer-only-checkpoints ... (this folder's ppo "
               f"and cory-no-re checkpoints) --out {own}, then --resume")
    else:
        grown = ",".join([*cfg.methods, *sorted({"ppo", "cory-no-re"} - has)])
        how = (f"measure it at this run's budget with python -m benchmarks.mechanism --measure "
               f"{task} --out {own} (it trains ppo and cory-no-re at this budget), or run them "
               f"here first (--resume --methods {grown}) and read their checkpoints "
               f"(--ppo-checkpoints, --observer-only-checkpoints), then --resume")
    return {"not_measured": "; ".join(other + [how]) if other else
            f"the model is not an offline reference LM; {how}"}


def wandb_run(cfg: BenchConfig, spec: RunSpec, folder: RunFolder):
    """A Weights & Biases run for one training run (cfg.wandb: "offline" or "online")."""
    import wandb

    return wandb.init(project="cory", group=folder.path.name, name=spec.key,
                      dir=str(folder.path), mode=cfg.wandb, config=spec.ids(),
                      settings=wandb.Settings(silent=True))


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
    folder = RunFolder(out)
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


def _run_all(cfg: BenchConfig, folder: RunFolder, resume: bool, progress: bool,
             stop_after: int | None, allow_changed_code: bool, execution: Execution) -> Path:
    """run_benchmark's body (under the folder's lock): runs not yet done, then the report."""
    if resume:
        saved = folder.saved_config()
        check_resume(cfg, saved)
        folder.check_code(cfg, allow_changed_code)
        folder.grow(cfg, saved)
    else:
        folder.start(cfg)
    for orphan in remove_orphans(folder.path):
        folder.log(f"removed {orphan.relative_to(folder.path)}, left by an interrupted save")
    refresh_mechanism(cfg, folder)
    specs = run_specs(cfg)
    todo = [s for s in specs if not folder.done_marker(s).exists()]
    engine = make_engine(execution, cfg.threads, gpus=1.0 if cfg.train.device.startswith("cuda")
                         else 0.0)
    bar = Progress(cfg, specs, engine.capacity, enabled=progress)
    for spec in specs:
        if spec not in todo:
            bar.finished(spec.key)
    if engine.ckpt_dir is None and execution.ray is None:  # this machine: the folder itself
        engine.ckpt_dir = str(folder.path / "ckpt")
        (folder.path / "ckpt").mkdir(parents=True, exist_ok=True)
    folder.log(f"{'resuming' if resume else 'starting'} {len(specs)} runs ({len(todo)} to run"
               f"{_where(execution, cfg.threads)}; {thread_setting(cfg.threads)})")
    if cfg.kl_coef_sweep:  # the grid every task runs, as recorded in run_config.json
        grid = ", ".join(f"{c:g}" for c in cfg.kl_coef_sweep)
        folder.log(f"KL-coefficient sweep: {grid} (fixed, on every task)")
        print(f"KL-coefficient sweep: {grid} (fixed, on every task)", file=sys.stderr)
    failed = run_study(cfg, folder, todo, engine, bar, stop_after,
                       wandb_run if cfg.wandb and execution.workers == 1 else None)
    bar.close()
    if failed and not folder.metrics.exists():  # nothing ran: no report, the start undone
        raise StudyFailed(_failures(failed, folder))
    canonical_order(folder, specs)
    finished = all(folder.done_marker(s).exists() for s in specs)
    from .report import write_report  # deferred: `python -m benchmarks.report` runs it as main

    path = write_report(folder.path)
    folder.log(f"report written ({'complete' if finished else 'partial'})")
    if failed:
        raise StudyFailed(_failures(failed, folder) + "; the others finished and the report is "
                          "written; --resume runs the failed ones again")
    return path


def _failures(failed: dict[str, str], folder: RunFolder) -> str:
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
