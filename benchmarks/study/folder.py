"""A study's study folder: its files, written incrementally (the `benchmarks` docstring lists them).

    folder = StudyFolder("runs/smoke"); folder.start(cfg)   # or saved_config() to resume
    folder.append(records); folder.add_evals(evals); folder.log("...")

Each iteration appends to metrics.jsonl/metrics.csv and TensorBoard, then checkpoints; a
resumed run reloads the checkpoint and drops what was written after it.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import time
from pathlib import Path

from benchmarks.evidence.records import FORMAT, check_format, gzipped_records, read_json
from benchmarks.settings.config import GROWABLE, BenchConfig, RunSpec, from_saved
from cory_common.files import atomic_write
from cory_common.runlog import (
    append_jsonl,
    changed_code,
    code_identity,
    ledger,
    read_jsonl,
    resume_ledger,
)

ID_COLUMNS = ("task", "method", "seed", "swept_kl_coef", "run", "iteration", "agent", "role",
              "position", "rotation")
CSV_COLUMNS = ID_COLUMNS + (
    "task_reward", "task_reward_std", "kl", "combined_reward", "report_kl_coef", "kl_coef",
    "collective_reward", "copy_rate", "distinct_1", "distinct_2", "repetition_rate",
    "response_length", "value_loss", "policy_loss", "loss", "clipfrac", "value_clipfrac",
    "approx_kl", "entropy", "ratio_mean", "grad_norm", "kl_loss", "sampled_neg_logprob",
    "optimizer_steps", "epochs_run", "skipped_batches", "time_rollout_s", "time_update_s")
class StudyFolder:
    """The files of a benchmark study folder (see the module docstring)."""

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
        """A new study folder: refuse to reuse one, write run_config.json."""
        if self.config.exists():
            raise ValueError(f"study folder {self.path} already holds a run; pass --resume to "
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
                             "study folder, or pass --allow-changed-code")
        for message in changed:
            self.log(f"resumed with changed code (--allow-changed-code): {message}")

    def check_records(self) -> None:
        """Every record line of metrics.jsonl and alone.jsonl readable, finished runs' too
        (LedgerError names the first bad line; a torn last line is the resume's to drop)."""
        for path in (self.metrics, self.evals):
            ledger(path)

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
