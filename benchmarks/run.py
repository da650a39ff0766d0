"""Command line: compare methods on tasks over seeds, then write metrics, plots and a report.

    python -m benchmarks.run                      # ppo vs cory on sentiment, 3 seeds
    python -m benchmarks.run --quick              # a smoke run of about a minute
    python -m benchmarks.run --methods ppo,cory,cory-no-kt,cory-no-re --tasks arithmetic
    python -m benchmarks.run --kl-coef-sweep --tasks arithmetic          # + a Pareto plot
    python -m benchmarks.run --preset gsm8k       # the paper's GPU setting (hub access needed)
    python -m benchmarks.run --resume --out runs/X                  # continue a killed run
    python -m benchmarks.run --resume --out runs/X --seeds 0,1,2,3,4  # ... with two more seeds
    python -m benchmarks.run --preset real --workers 2 --threads 1    # two runs at once
    python -m benchmarks.run --preset real --ray auto                 # on a Ray cluster

Every setting of `benchmarks.BenchConfig` is an option (`--batch-size`, `--lr`, ...); a
preset fills them first, `--quick` shrinks them, explicit options win. `--resume` alone
continues with the folder's saved settings; settings given with it must equal those, except
`--seeds` and `--methods`, which may add entries (new runs) but never drop a saved one.
`--workers`, `--ray` and `--storage` say where the runs execute and change no record: a study
made with `--workers 2` equals one made with `--workers 1` (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.training.config import catalogue
from benchmarks.settings.config import (
    BenchConfig,
    add_config_options,
    resolve_config,
    resume_config,
    run_specs,
)
from benchmarks.study.coordinator import StudyFailed, StudyFolder, run_benchmark
from benchmarks.study.executors import Execution
from cory_common import cli
from cory_common.runlog import FolderBusy, LedgerError
from cory_common.threads import configure


def build_parser() -> argparse.ArgumentParser:
    """An option per BenchConfig field (defaults left out, so explicit ones are known)."""
    parser = cli.Parser("python -m benchmarks.run", description=__doc__,
                                     argument_default=argparse.SUPPRESS,
                                     epilog=catalogue())
    add_config_options(parser)
    cli.add_options(parser, Execution, Execution())
    parser.add_argument("--out", help="study folder (default runs/<timestamp>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out (its settings; more --seeds or "
                        "--methods add runs)")
    parser.add_argument("--allow-changed-code", action="store_true",
                        help="--resume even though an --import file changed (logged)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--plan", action="store_true",
                        help="check every setting and list the runs, then stop: nothing is "
                        "loaded or written")
    return parser


def config_from_args(args: argparse.Namespace) -> tuple[BenchConfig, Path, bool]:
    """The resolved settings, the study folder and the resume flag; raises ValueError."""
    given = dict(vars(args))
    out, resume = given.pop("out", None), given.pop("resume", False)
    for name in ("no_progress", "allow_changed_code", "plan", *EXECUTION):
        given.pop(name, None)
    if resume and not out:
        raise ValueError("--resume needs --out, the folder of the run to continue")
    out = Path(out or Path("runs") / time.strftime("%Y-%m-%d_%H-%M-%S"))
    if resume:  # the saved settings, and only what was typed compared with them
        return resume_config(given, StudyFolder(out).saved_config()).validate(), out, True
    cfg = resolve_config(given.pop("preset", "offline"), given.pop("quick", False), **given)
    return cfg, out, resume


EXECUTION = tuple(f.name for f in dataclasses.fields(Execution))


def plan(cfg: BenchConfig, out: Path, resume: bool) -> str:
    """What the command would run, in words: the settings that size it and each run's key."""
    specs = run_specs(cfg)
    t = cfg.train
    model = t.model or "the task's offline LM"
    head = (f"{'resume' if resume else 'new'} study folder {out}: {len(specs)} runs of "
            f"{t.iterations} iterations x batch {t.batch_size}, model {model}, "
            f"decode {t.decode}")
    return "\n".join([head] + [f"  {s.key}" for s in specs])


def execution_from(args: argparse.Namespace) -> Execution:
    """The --workers, --ray and --storage settings (checked by run_benchmark)."""
    return Execution(**{k: v for k, v in vars(args).items() if k in EXECUTION})


def _interrupt(signum, frame):
    """SIGTERM as Ctrl-C."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> Path:
    """Parse the command line, run the benchmark, print where the report is."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if __name__ == "__main__":  # SIGTERM unwinds like Ctrl-C: a failed start leaves nothing
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        cfg, out, resume = config_from_args(args)
        execution = execution_from(args).check(cfg.threads, cfg.wandb)
    except ValueError as err:
        parser.error(cli.in_flags(str(err), BenchConfig))
    configure(restart=__name__ == "__main__")  # the runs' threads are set where they run
    if getattr(args, "plan", False):
        print(plan(cfg, out, resume))
        return out
    try:
        path = run_benchmark(cfg, out, resume=resume,
                             progress=not getattr(args, "no_progress", False),
                             allow_changed_code=getattr(args, "allow_changed_code", False),
                             execution=execution)
    except StudyFailed as err:
        parser.exit(1, f"{parser.prog}: {err}\n")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the workers are stopped, the folder kept
        parser.exit(130, f"{parser.prog}: stopped; python -m benchmarks.run --resume --out "
                         f"{out} continues it\n")
    except (FolderBusy, LedgerError, ValueError) as err:
        if isinstance(err, (FolderBusy, LedgerError)) or str(err).startswith(
                ("--resume", "study folder", "--ray")):
            parser.exit(2, f"{parser.prog}: error: {err}\n")
        raise
    print(f"report: {path}")
    print(f"plots:  {Path(path).parent / 'plots'}")
    return path


if __name__ == "__main__":
    main()
