"""Benchmarks: train methods over tasks and seeds with one shared setting, then report.

    from benchmarks import resolve_config, run_benchmark
    cfg = resolve_config("quick")                   # or "offline", "imdb", "imdb-xl", "gsm8k"
    run_benchmark(cfg, "runs/smoke")                # metrics, TensorBoard, plots, report.md

A study folder holds (all written incrementally; a kill loses at most the iteration in progress):

    run_config.json   the resolved settings (``--resume`` refuses different ones)
    metrics.jsonl     one line per task/method/seed/kl_coef/iteration/agent, numbers + samples
    metrics.csv       the same rows' common numeric columns (study.folder.CSV_COLUMNS)
    alone.jsonl       every model answering held-out queries alone every eval_every iterations:
                      task reward, ΣKL, combined reward (+ pass@k on exact-match tasks)
    mechanism.json    the model's knowledge and cross-role transfer (benchmarks.mechanism.measure)
    log.txt           one line per iteration and per event
    tb/<run key>/     TensorBoard scalars
    ckpt/<run key>.pt the latest full-state Trainer checkpoint; done/<run key> once finished
    plots/*.png       alone and in-training curves, the reward–KL frontier, a kl_coef sweep's front
    report.md         the mechanism, the claims' verdicts, tables, audit, samples

A published folder may keep metrics.jsonl gzipped (metrics.jsonl.gz); `read_jsonl` reads either;
`--resume` and `benchmarks.migrate` refuse it until it is gunzipped.

Rooms, each importing only the ones listed before it (`tests/test_architecture.py`):

    settings/   what a study is asked to run: BenchConfig and its runs, the presets
    evidence/   the records as numbers and what they support: records, intervals, stats,
                trajectories, frontier, budgets, pioneer, claims, transfer, plan
    mechanism/  whether a model has CORY's mechanism, measured (`python -m benchmarks.mechanism`)
    report/     report.md and the plots, from the records only (`python -m benchmarks.report`)
    study/      running a study: the coordinator, the study folder, the recorder, the executors,
                a run's worker, the alone evaluation, progress, the folder's mechanism.json

The commands sit at the top: `run` (run or resume a study), `why` (a pre-stated plan's table),
`compare`, `merge` (study folders made elsewhere, as one), `migrate` (an older folder's names,
once) and `calibrate` (how often the claims' verdicts are wrong).
"""

from benchmarks.settings.config import (
    PAPER_KL_COEFS,
    BenchConfig,
    RunSpec,
    check_resume,
    quick_settings,
    resolve_config,
    run_specs,
    train_config,
)
from benchmarks.settings.presets import PRESETS
from benchmarks.study.coordinator import run_benchmark
from benchmarks.study.evaluate import evaluate_policy
from benchmarks.study.folder import StudyFolder

__all__ = ["BenchConfig", "PRESETS", "PAPER_KL_COEFS", "RunSpec", "StudyFolder", "resolve_config",
           "run_benchmark", "run_specs", "train_config", "evaluate_policy", "quick_settings",
           "check_resume"]
