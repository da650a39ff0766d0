"""Where a study's CPU time should go, from a finished study folder: the variance components of
a paired contrast's alone gain, and the cheapest allocations of seeds, evaluation points and
openings that keep its interval as narrow as the folder's own.

    python -m benchmarks.allocate docs/fidelity/factors --task reviews --contrast cory,ppo
    python -m benchmarks.allocate docs/fidelity/math-fixed-kl --task reasoning --contrast cory,ppo

Costs are the folder's own: each method's training seconds an iteration (its records) and one
model's 256-opening evaluation (its log), as the study ran them. `benchmarks.evidence.allocation`
states the model.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.evidence.allocation import allocation_table, components, eval_seconds
from benchmarks.evidence.records import RunData, no_records
from cory_common import cli
from cory_common.threads import configure


def main(argv: list[str] | None = None) -> None:
    """Print the components and the allocation table of one contrast of a study folder."""
    p = cli.Parser("python -m benchmarks.allocate", description=__doc__)
    p.add_argument("folder", help="a finished study folder")
    p.add_argument("--task", required=True, help="the task of the contrast")
    p.add_argument("--contrast", required=True, metavar="A,B", help="two methods, a − b")
    args = p.parse_args(argv)
    if why := no_records(args.folder):
        p.error(why)
    methods = [m.strip() for m in args.contrast.split(",")]
    if len(methods) != 2 or not all(methods):
        p.error(f"--contrast takes two methods separated by a comma, got {args.contrast!r}")
    configure()
    try:
        data = RunData.load(args.folder)
        c = components(data, args.task, *methods)
        iterations = int(data.config.get("train", {}).get("iterations", 0))
        evaluation = eval_seconds(Path(args.folder), data, args.task)
        lines, best = allocation_table(data, args.task, *methods, iterations, evaluation,
                                       (c.seeds, c.points, c.openings))
    except ValueError as err:
        p.error(str(err))
    a, b = methods
    print(f"{a} − {b} on {args.task} ({args.folder}: {c.seeds} seeds, {c.points} points after "
          f"the base, {c.openings} openings, {iterations} iterations)")
    sd = math.sqrt(c.variance(c.points, c.openings))
    print(f"per-seed sd of the alone-gain difference {sd:.3f}: seeds {math.sqrt(c.seed):.3f}, "
          f"points {math.sqrt(c.point):.3f} a point, openings {math.sqrt(c.opening):.3f} a "
          f"point at {c.openings}")
    print(f"one model's evaluation of 256 openings: {evaluation:.1f} s\n")
    print("\n".join(lines))
    hours, width, s, pts, q = best
    print(f"\ncheapest no wider than today: {s} seeds, {pts} points, {q} openings "
          f"({width:.3f} wide, {hours:.2f} CPU-hours)")


if __name__ == "__main__":
    main()
