"""One training run of a study, as a worker runs it: train, evaluate alone, checkpoint, and say
each step as a message; the coordinator (`benchmarks.study.coordinator`) writes every file.

    train_run(job, emit)     # emit(("records", key, [...])), ("evals", ...), ("checkpoint", ...)

The same function runs in the coordinating process (`--workers 1`), in a worker process of this
machine (`--workers N`) and as a Ray task on any node (`--ray`): it never touches the run
folder. A checkpoint travels as a file in `job.ckpt_dir` (a path the coordinator can also
reach: the study folder on this machine, or `--storage`) that the coordinator moves into place
after the records before it, or, with no such path, as bytes.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from agents.llm.engine import decodes_fast
from agents.llm.sampling import SAMPLER
from agents.training.train import Trainer
from benchmarks.settings.config import BenchConfig, RunSpec, train_config
from benchmarks.study.evaluate import evaluate_alone, evaluation_due
from cory_common.plugins import load_plugins
from cory_common.runlog import code_commit

Emit = Callable[[tuple], None]


@dataclass
class Job:
    """What a worker needs for one run: the settings, where to start and what to carry."""

    cfg: BenchConfig
    spec: RunSpec
    start: int = 0  # the checkpoint's iteration (0: a fresh run)
    ckpt: bytes | str | None = None  # the checkpoint to continue: a path, its bytes, or none
    ckpt_dir: str | None = None  # where to write new checkpoints (none: send their bytes)
    eval_at_start: bool = False  # the start iteration's alone evaluation is not recorded yet
    roles: dict | None = None  # each model's role in the iteration before `start`
    stop_after: int | None = None  # testing: stop after this iteration, as a kill would


def provenance(trainer: Trainer) -> dict:
    """What a record's numbers rest on beyond its settings: the code's commit ("-dirty": with
    uncommitted changes) and what changes its draws (the decode path, the sampler and torch's
    version)."""
    fast = any(decodes_fast(p) for p in trainer.learner.policies.values())
    return {"commit": code_commit(), "draws": f"decode {'fast' if fast else 'exact'}, "
                                              f"{SAMPLER}, torch {torch.__version__}"}


def flatten(metrics: dict, spec: RunSpec, time_fields=("time_rollout_s", "time_update_s")
            ) -> list[dict]:
    """A Trainer step's metrics as one flat record per agent."""
    out = []
    common = {"iteration": metrics["iteration"], "rotation": metrics["rotation"],
              **{k: metrics[k] for k in time_fields if k in metrics}}
    for agent in sorted(k for k in metrics if k.startswith("llm_")):
        values = {k: v for k, v in metrics[agent].items()
                  if isinstance(v, (int, float, str, list)) or v is None}
        out.append({**spec.ids(), "agent": agent, **common, **values})
    return out


def _evaluate(trainer: Trainer, job: Job, roles: dict, emit: Emit) -> None:
    """The alone evaluation at the trainer's iteration, as an "evals" message (a "log" one
    when the test split can't be loaded)."""
    cfg, spec = job.cfg, job.spec
    if trainer.env.task.exact_match and cfg.eval_problems == 0:
        return
    final = trainer.iteration == cfg.train.iterations
    try:
        records = evaluate_alone(trainer, cfg, spec, roles, final=final)
    except OSError as err:  # e.g. the GSM8K test split without hub access
        emit(("log", spec.key, f"alone-evaluation skipped, test split unavailable: {err}"))
        return
    emit(("evals", spec.key, [{**r, **provenance(trainer)} for r in records]))


def _checkpoint(trainer: Trainer, job: Job, emit: Emit) -> None:
    """Save the trainer and send it: a file in job.ckpt_dir, or its bytes."""
    if job.ckpt_dir is not None:
        fd, path = tempfile.mkstemp(dir=job.ckpt_dir, prefix=f".{job.spec.key}.",
                                    suffix=".pt.tmp")  # an orphan is removed on resume
        os.close(fd)
        trainer.save(path)
        emit(("checkpoint", job.spec.key, trainer.iteration, {"path": path}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        trainer.save(str(Path(tmp) / "ckpt.pt"))
        data = (Path(tmp) / "ckpt.pt").read_bytes()
    emit(("checkpoint", job.spec.key, trainer.iteration, {"bytes": data}))


def _load(trainer: Trainer, job: Job) -> None:
    """Continue from the job's checkpoint, a path or bytes."""
    if isinstance(job.ckpt, str):
        trainer.load(job.ckpt)
        return
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "ckpt.pt").write_bytes(job.ckpt)
        trainer.load(str(Path(tmp) / "ckpt.pt"))


def train_run(job: Job, emit: Emit) -> bool:
    """Train (or continue) one run, emitting its records, evaluations and checkpoints in order;
    True once finished (a "done" message sent), False when stopped by job.stop_after."""
    cfg, spec = job.cfg, job.spec
    load_plugins(cfg.imports)  # a fresh worker knows only the built-in learners and tasks
    trainer = Trainer(train_config(cfg, spec))
    paths = {getattr(p, "decode_path", None) for p in trainer.learner.policies.values()} - {None}
    if paths:
        emit(("log", spec.key, "; ".join(sorted(paths))))
    if job.ckpt is not None:
        _load(trainer, job)
        if trainer.iteration != job.start:
            raise ValueError(f"{spec.key}: the checkpoint is at iteration {trainer.iteration}, "
                             f"the coordinator expected {job.start}")
    made, cpu = provenance(trainer), time.process_time()
    if job.eval_at_start and evaluation_due(cfg, trainer.iteration):
        _evaluate(trainer, job, job.roles or {}, emit)
    while trainer.iteration < cfg.train.iterations:
        if job.stop_after is not None and trainer.iteration >= job.stop_after:
            return False
        records, evals = flatten(trainer.step(), spec), []
        if evaluation_due(cfg, trainer.iteration):
            _evaluate(trainer, job, {r["agent"]: r["role"] for r in records}, evals.append)
        now = time.process_time()  # each record's share of the CPU since the last ones
        share, cpu = round((now - cpu) / len(records), 3), now
        emit(("records", spec.key, [{**r, **made, "time_cpu_s": share} for r in records]))
        for message in evals:
            emit(message)
        if trainer.iteration % cfg.checkpoint_every == 0 \
                or trainer.iteration == cfg.train.iterations:
            _checkpoint(trainer, job, emit)
    emit(("done", spec.key))
    del trainer
    gc.collect()
    return True
