"""Benchmarks: train methods over tasks and seeds with one shared setting, then report.

    from benchmarks import resolve_config, run_benchmark
    cfg = resolve_config("quick")                   # or "offline", "imdb", "imdb-xl", "gsm8k"
    run_benchmark(cfg, "runs/smoke")                # metrics, TensorBoard, plots, report.md

A run folder holds (all written incrementally; a kill loses at most the iteration in progress):

    run_config.json   the resolved settings (``--resume`` refuses different ones)
    metrics.jsonl     one line per task/method/seed/eta/iteration/agent, numbers + samples
    metrics.csv       the same rows' common numeric columns (runner.CSV_COLUMNS)
    eval.jsonl        pass@1 / pass@k / greedy accuracy on the test split (exact-match tasks)
    log.txt           one line per iteration and per event
    tb/<run key>/     TensorBoard scalars
    ckpt/<run key>.pt the latest full-state Trainer checkpoint; done/<run key> once finished
    plots/*.png       curves (mean ± std over seeds) and, with an η sweep, a Pareto plot
    report.md         the table, contribution audit, samples, evaluation and claim checks

Modules: `config` (BenchConfig: the sweep plus a nested TrainConfig; validation, runs, CLI
options), `presets` (the paper's GPU settings), `runner` (the run folder, resume, progress, the
driver), `evaluate` (pass@k on the test split), `records` (a run's numbers), `claims` (the
paper's claims, checked), `report` (tables, plots and report.md from the records alone) and
`run` (the command line).
"""

from .config import (
    PAPER_ETAS,
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

__all__ = ["BenchConfig", "PRESETS", "PAPER_ETAS", "RunSpec", "RunFolder", "resolve_config",
           "run_benchmark", "run_specs", "train_config", "evaluate_policy", "quick_settings",
           "check_resume"]
