"""A study's runs, spread over an executor, with one writer: this process.

    failed = run_study(cfg, folder, specs, executor, bar)   # {run key: the worker's traceback}

Each run is prepared here (its checkpoint found, records after it dropped), sent to the
executor (`benchmarks.study.executors`: this process, N local workers or a Ray cluster), and every
message it sends back is written here, in the order the run sent them: records, alone
evaluations, then the checkpoint that follows them, so a checkpoint is never ahead of the
records. When the study ends the records are put in run order (`canonical_order`), so a
folder made by N workers equals, record for record, the one made by one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from benchmarks.evidence.records import select
from benchmarks.settings.config import BenchConfig, RunSpec, run_weight
from benchmarks.study.folder import StudyFolder
from benchmarks.study.progress import Progress
from benchmarks.study.worker import Job
from cory_common.files import atomic_write
from cory_common.runlog import jsonl_text, read_jsonl

TIME_FIELDS = ("time_rollout_s", "time_update_s")
ID_SKIP = ("task", "method", "seed", "swept_kl_coef", "run", "iteration", "agent", "role",
           "position", "rotation", "samples")


def numeric(record: dict) -> dict[str, float]:
    """The record's numeric metrics (for TensorBoard)."""
    return {k: float(v) for k, v in record.items() if k not in ID_SKIP
            and isinstance(v, (int, float)) and not isinstance(v, bool)}


def checkpoint_iteration(path: Path) -> int:
    """The iteration a checkpoint file continues from (its tensors are not read)."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False, mmap=True)
                   ["iteration"])
    except Exception as err:  # noqa: BLE001  a corrupt or foreign file, named
        raise ValueError(f"checkpoint {path} cannot be read (corrupt, or not a torch file): "
                         f"{type(err).__name__}: {err}") from None


def prepare_job(cfg: BenchConfig, spec: RunSpec, folder, ckpt_dir: str | None,
                stop_after: int | None = None) -> Job:
    """The job of one run: where its checkpoint stands, its records after it dropped, and
    the checkpoint as the executor carries it (a path it can read, or bytes)."""
    path, start, ckpt = folder.ckpt(spec), 0, None
    if path.exists():
        start = checkpoint_iteration(path)
        ckpt = _ship(path, ckpt_dir, folder)
        folder.log(f"{spec.key}: resumed from iteration {start}")
    dropped = folder.truncate(spec, start) + folder.truncate_evals(spec, start)
    if dropped:
        folder.log(f"{spec.key}: dropped {dropped} records written after the checkpoint")
    roles = {r["agent"]: r["role"] for r in select(read_jsonl(folder.metrics), run=spec.key,
                                                    iteration=start - 1)}
    return Job(cfg, spec, start, ckpt, ckpt_dir, not folder.has_eval(spec.key, start), roles,
               stop_after)


def _ship(path: Path, ckpt_dir: str | None, folder) -> bytes | str:
    """A checkpoint as the executor carries it: its path on this machine, a copy in the shared
    storage, or its bytes (through Ray's object store)."""
    if ckpt_dir is None:
        return path.read_bytes()
    if Path(ckpt_dir).resolve() == (folder.path / "ckpt").resolve():
        return str(path)
    fd, copy = tempfile.mkstemp(dir=ckpt_dir, prefix=f".{path.stem}.in.", suffix=".pt.tmp")
    os.close(fd)
    shutil.copyfile(path, copy)
    return copy


class Recorder:
    """Writes what the runs send into the study folder (see the module docstring)."""

    def __init__(self, cfg: BenchConfig, folder: StudyFolder, bar: Progress, wandb: bool = False):
        self.cfg, self.folder, self.bar, self.wandb = cfg, folder, bar, wandb
        self.writers: dict[str, object] = {}
        self.wandbs: dict[str, object] = {}
        self.ended: dict[str, str | None] = {}
        self.specs: dict[str, RunSpec] = {}

    def expect(self, spec: RunSpec, start: int) -> None:
        """A run about to start at iteration `start` (its TensorBoard drops later steps)."""
        from torch.utils.tensorboard import SummaryWriter

        self.specs[spec.key] = spec
        tb = self.folder.path / "tb" / spec.key
        self.writers[spec.key] = SummaryWriter(str(tb), purge_step=start if tb.exists() else None)
        if self.wandb:
            self.wandbs[spec.key] = wandb_run(self.cfg, spec, self.folder)
        self.bar.begin(spec.key, start)

    def __call__(self, message: tuple) -> None:
        """Write one message of a run."""
        kind, key, *rest = message
        folder = self.folder
        if kind == "records":
            self._records(key, rest[0])
        elif kind == "evals":
            folder.add_evals(rest[0])
            self.bar.unit(key, "evaluation")
            folder.log(f"{key} alone at iteration {rest[0][0]['iteration']}: " + ", ".join(
                f"{r['agent']} reward {r['task_reward']:.3f} kl {r['kl']:.3f}" for r in rest[0]))
        elif kind == "checkpoint":
            self._install(key, rest[1])
        elif kind == "log":
            folder.log(f"{key}: {rest[0]}")
        elif kind == "done":
            folder.done_marker(self.specs[key]).parent.mkdir(parents=True, exist_ok=True)
            folder.done_marker(self.specs[key]).touch()
            folder.log(f"{key}: finished")
            self.bar.finished(key)
        elif kind == "end":
            self.end(key, rest[0])

    def _records(self, key: str, records: list[dict]) -> None:
        """One iteration's records: the folder, TensorBoard, W&B, the log and the bar."""
        self.folder.append(records)
        it = records[0]["iteration"]
        scalars = {f"{r['agent']}/{name}": value for r in records
                   for name, value in numeric(r).items()}
        writer = self.writers[key]
        for name, value in scalars.items():
            writer.add_scalar(name, value, it)
        writer.flush()
        if key in self.wandbs:
            self.wandbs[key].log({**scalars, "iteration": it})
        parts = [f"{r['agent']}({r['role'][0]}) reward {r['task_reward']:.4g} kl {r['kl']:.4g}"
                 for r in records]
        times = sum(records[0].get(k, 0.0) for k in TIME_FIELDS)
        self.folder.log(f"{key} it {it}: " + ", ".join(parts) + f" [{times:.1f}s]")
        self.bar.unit(key, "iteration")

    def _install(self, key: str, payload: dict) -> None:
        """Put a run's new checkpoint in place, atomically, after the records before it."""
        final = self.folder.ckpt(self.specs[key])
        final.parent.mkdir(parents=True, exist_ok=True)
        if "bytes" in payload:
            atomic_write(final, payload["bytes"])
            return
        source = Path(payload["path"])
        if source.parent.resolve() != final.parent.resolve():  # from the shared storage
            fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
            os.close(fd)
            shutil.copyfile(source, tmp)
            source.unlink(missing_ok=True)
            source = Path(tmp)
        os.replace(source, final)

    def end(self, key: str, error: str | None) -> None:
        """A run ended: finished, stopped, or failed with the worker's traceback."""
        self.ended[key] = error
        self.bar.ended(key)
        if error:
            self.folder.log(f"{key}: failed on its worker:\n{error}")
        writer = self.writers.pop(key, None)
        if writer is not None:
            writer.close()
        if key in self.wandbs:
            self.wandbs.pop(key).finish()


def longest_first(specs: list[RunSpec]) -> list[RunSpec]:
    """The runs, the costliest first (models trained x episodes per iteration), so that
    parallel workers do not end on one long run; the records' order does not depend on it."""
    return sorted(specs, key=lambda s: run_weight(s.method), reverse=True)  # stable


def run_study(cfg: BenchConfig, folder: StudyFolder, specs: list[RunSpec], executor, bar: Progress,
              stop_after: int | None = None, wandb: bool = False) -> dict[str, str]:
    """Run every spec on the executor, writing what they send; returns {run: why} of the runs
    that failed (a worker's traceback, or how its worker was lost). The others go on."""
    recorder = Recorder(cfg, folder, bar, wandb)
    pending, running = longest_first(specs) if executor.capacity > 1 else list(specs), set()
    try:
        while pending or running:
            while pending and len(running) < executor.capacity:
                spec = pending.pop(0)
                job = prepare_job(cfg, spec, folder, executor.ckpt_dir, stop_after)
                recorder.expect(spec, job.start)
                running.add(spec.key)
                executor.submit(job, recorder)
                running -= recorder.ended.keys()  # this process's executor ran it in submit
            for event in executor.wait(0.5) if running else ():
                if event[0] == "message":
                    recorder(event[1])
                elif event[1] not in recorder.ended:  # a lost worker: no "end" will come
                    recorder.end(event[1], f"its worker was lost: {event[2]}")
            running -= recorder.ended.keys()
    finally:
        executor.close()
        for key in list(recorder.writers):
            recorder.end(key, recorder.ended.get(key))
    return {k: e for k, e in recorder.ended.items() if e}


def canonical_order(folder, specs: list[RunSpec]) -> None:
    """Rewrite the records in run order (each run's own order kept; records of runs not in
    `specs` after them), so the order never depends on which run finished first."""
    rank = {s.key: i for i, s in enumerate(specs)}
    for path in (folder.metrics, folder.evals):
        rows = read_jsonl(path)
        ordered = sorted(rows, key=lambda r: rank.get(r.get("run"), len(rank)))
        if ordered != rows:
            atomic_write(path, jsonl_text(ordered))
    folder.sync_csv()


def wandb_run(cfg: BenchConfig, spec: RunSpec, folder: StudyFolder):
    """A Weights & Biases run for one training run (cfg.wandb: "offline" or "online")."""
    import wandb

    return wandb.init(project="cory", group=folder.path.name, name=spec.key,
                      dir=str(folder.path), mode=cfg.wandb, config=spec.ids(),
                      settings=wandb.Settings(silent=True))
