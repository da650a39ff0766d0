"""Command line: build (once) the offline reference LMs and print their held-out reports.

    python -m agents.refmodels [--tasks sentiment,arithmetic] [--budget full|tiny] [--force]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cory_env.data.tokenizer import TASKS

from .data import check_task
from .measure import format_report, repeated_gap
from .pretrain import BUDGET_ENV, BUDGETS, build, model_dir, rebuild, reference_lm, resolve_budget


def main(argv: Sequence[str] | None = None) -> int:
    """Build (once) the offline reference LMs and print their reports."""
    parser = argparse.ArgumentParser(prog="python -m agents.refmodels",
                                     description="Build (once) the offline reference LMs and "
                                                 "print their held-out reports.")
    parser.add_argument("--tasks", default=",".join(TASKS),
                        help="comma-separated tasks (default: %(default)s)")
    parser.add_argument("--budget", default=None, choices=sorted(BUDGETS),
                        help=f"training preset (default: ${BUDGET_ENV} or full)")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--gap-repeats", type=int, default=0, metavar="N",
                        help="then measure each model's observer gap N more times (noise check)")
    parser.add_argument("--worker", nargs=3, metavar=("TASK", "BUDGET", "OUT"),
                        help=argparse.SUPPRESS)  # internal: build into OUT (see _launch)
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        task, budget, out = args.worker
        build(task, budget, Path(out), verbose=not args.quiet)
        return 0
    budget = resolve_budget(args.budget)
    for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        check_task(task)
        t0 = time.perf_counter()
        cached = model_dir(task, budget).is_dir() and not args.force
        path = rebuild(task, budget) if args.force else reference_lm(task, budget=budget)
        report = json.loads((path / "report.json").read_text())
        if cached:
            print(format_report(report))
        print(f"[cory lm] {task}-{budget}: {path} "
              f"({'cached' if cached else f'built in {time.perf_counter() - t0:.0f}s'})")
        if args.gap_repeats:
            r = repeated_gap(task, path, args.gap_repeats)
            print(f"[cory lm] {task} observer gap over {args.gap_repeats} x "
                  f"{r['episodes_each']} episodes: {r['mean']:+.3f} +- {r['se']:.3f} (SE); "
                  f"each: {' '.join(f'{g:+.3f}' for g in r['gaps'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
