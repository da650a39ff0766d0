"""Benchmarks: train methods over tasks and seeds with one shared setting, then report.

    from benchmarks import resolve_config, run_benchmark
    cfg = resolve_config("quick")                   # or "offline", "imdb", "imdb-xl", "gsm8k"
    run_benchmark(cfg, "runs/smoke")                # metrics, TensorBoard, plots, report.md

A run folder holds (all written incrementally; a kill loses at most the iteration in progress):

    run_config.json   the resolved settings (``--resume`` refuses different ones)
    metrics.jsonl     one line per task/method/seed/kl_coef/iteration/agent, numbers + samples
    metrics.csv       the same rows' common numeric columns (runner.CSV_COLUMNS)
    alone.jsonl       every model answering held-out queries alone every eval_every iterations:
                      task reward, ΣKL, combined reward (+ pass@k on exact-match tasks)
    mechanism.json    the model's knowledge and cross-role transfer (benchmarks.transfer)
    log.txt           one line per iteration and per event
    tb/<run key>/     TensorBoard scalars
    ckpt/<run key>.pt the latest full-state Trainer checkpoint; done/<run key> once finished
    plots/*.png       alone and in-training curves, the reward–KL frontier, a kl_coef sweep's front
    report.md         the mechanism, the claims' verdicts, tables, audit, samples

A published folder may keep metrics.jsonl gzipped (metrics.jsonl.gz); `read_jsonl` reads either;
`--resume` and `benchmarks.migrate` refuse it until it is gunzipped.

Modules: `config` (BenchConfig: the sweep plus a nested TrainConfig; validation, runs, CLI
options), `presets` (the paper's GPU settings), `runner` (the run folder, resume, the driver),
`engines` (where runs execute: this process, local workers, a Ray cluster), `worker` (one run,
as messages), `study` (the one writer: runs prepared, their messages written, records put in
run order), `progress` (runs done / running / waiting and the time left), `evaluate` (every
model alone on the test split), `records` (a run's numbers), `intervals` and `stats`
(intervals over seeds, frontiers and trends), `claims` (the paper's claims, decided),
`transfer` and `mechanism` (whether a model has CORY's mechanism, and its command line),
`report` (tables, plots and report.md from the records alone), `run` (the command line),
`merge` (run folders made elsewhere, as one) and `migrate` (an older folder's names, once).
"""

from .config import (
    PAPER_KL_COEFS,
    BenchConfig,
    RunSpec,
    check_resume,
    quick_settings,
    resolve_config,
    run_specs,
    train_config,
)
from .evaluate import evaluate_policy
from .presets import PRESETS
from .runner import RunFolder, run_benchmark

__all__ = ["BenchConfig", "PRESETS", "PAPER_KL_COEFS", "RunSpec", "RunFolder", "resolve_config",
           "run_benchmark", "run_specs", "train_config", "evaluate_policy", "quick_settings",
           "check_resume"]
