"""Command line: build (once) the offline reference LMs and print their held-out reports.

    python -m agents.refmodels [--tasks sentiment,arithmetic] [--size full|tiny] [--force]

Whether a model has CORY's mechanism (knowledge and cross-role transfer) is a study of its
own: `python -m benchmarks.mechanism --measure sentiment`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cory_common import cli
from cory_common.threads import configure
from cory_env.data.tokenizer import TASKS

from .data import check_task
from .measure import format_report, repeated_gap
from .pretrain import SIZE_ENV, build, model_dir, rebuild, reference_lm, resolve_size
from .sizes import SIZES


def main(argv: Sequence[str] | None = None) -> int:
    """Build (once) the offline reference LMs and print their reports."""
    parser = _parser()
    args = parser.parse_args(argv)
    configure(restart=__name__ == "__main__")
    if args.worker:
        task, size, out = args.worker
        build(task, size, Path(out), verbose=not args.quiet)
        return 0
    size = resolve_size(args.size)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    for task in tasks:
        try:
            check_task(task)
        except ValueError as err:
            parser.error(str(err))
    for task in tasks:
        _build(task, size, args.force, args.gap_repeats)
    return 0


def _parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    parser = cli.Parser("python -m agents.refmodels", description=__doc__,
                                     argument_default=argparse.SUPPRESS)
    parser.add_argument("--tasks", default=",".join(TASKS),
                        help="comma-separated tasks (default: %(default)s)")
    parser.add_argument("--size", default=None, choices=sorted(SIZES),
                        help=f"training preset (default: ${SIZE_ENV} or full)")
    parser.add_argument("--force", action="store_true", default=False,
                        help="rebuild even if cached")
    parser.add_argument("--gap-repeats", type=int, default=0, metavar="N",
                        help="then measure each model's observer gap N more times (noise check)")
    parser.add_argument("--worker", nargs=3, metavar=("TASK", "SIZE", "OUT"), default=None,
                        help=argparse.SUPPRESS)  # internal: build into OUT (see _launch)
    parser.add_argument("--quiet", action="store_true", default=False, help=argparse.SUPPRESS)
    return parser


def _build(task: str, size: str, force: bool, gap_repeats: int) -> None:
    """Build (or find cached) a task's reference LM and print its report."""
    t0 = time.perf_counter()
    cached = model_dir(task, size).is_dir() and not force
    path = rebuild(task, size) if force else reference_lm(task, size=size)
    report = json.loads((path / "report.json").read_text())
    if cached:
        print(format_report(report))
    if not (path / "transfer.json").exists():
        print(f"[cory lm] {task}: its mechanism is not measured yet "
              f"(python -m benchmarks.mechanism --measure {task})")
    print(f"[cory lm] {task}-{size}: {path} "
          f"({'cached' if cached else f'built in {time.perf_counter() - t0:.0f}s'})")
    if gap_repeats:
        r = repeated_gap(task, path, gap_repeats)
        print(f"[cory lm] {task} observer gap over {gap_repeats} x "
              f"{r['episodes_each']} episodes: {r['mean']:+.3f} +- {r['se']:.3f} (SE); "
              f"each: {' '.join(f'{g:+.3f}' for g in r['gaps'])}")


if __name__ == "__main__":
    sys.exit(main())
