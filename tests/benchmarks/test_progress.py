"""The time a study has left, estimated from what each unit has cost, on a fake clock."""

from __future__ import annotations

import io

from benchmarks.settings.config import RunSpec, resolve_config
from benchmarks.study.progress import Progress


class Clock:
    """A clock the test moves."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# a study like real-demo: ppo then cory, 30 iterations, evaluated every 5; cory's iterations
# cost 3x ppo's, an evaluation as much as 8 ppo iterations, loading a run 20 s
COST = {("ppo", "iteration"): 2.0, ("cory", "iteration"): 6.0,
        ("ppo", "evaluation"): 16.0, ("cory", "evaluation"): 32.0, ("ppo", "start"): 36.0,
        ("cory", "start"): 52.0}


def simulate(bar: Progress, clock: Clock, cfg, specs, check=None) -> None:
    """Play the study on the fake clock, calling check(bar, clock) after every unit."""
    for spec in specs:
        bar.begin(spec.key, 0)
        units = [("evaluation", 0)]
        for i in range(1, cfg.train.iterations + 1):
            units.append(("iteration", i))
            if i % 5 == 0:
                units.append(("evaluation", i))
        for n, (kind, _) in enumerate(units):
            clock.now += COST[(spec.method, "start" if n == 0 else kind)]
            bar.unit(spec.key, kind)
            if check:
                check(bar, clock)
        bar.finished(spec.key)


def test_the_estimate_counts_each_methods_units_and_is_right_from_a_quarter_in():
    cfg = resolve_config("offline", iterations=30, eval_every=5, methods=["ppo", "cory"],
                         seeds=[0])
    specs = [RunSpec("sentiment", "ppo", 0), RunSpec("sentiment", "cory", 0)]
    clock = Clock()
    total = Progress(cfg, specs, clock=clock, enabled=False)
    simulate(total, clock, cfg, specs)
    end = clock.now
    clock.now = 0.0
    errors = []

    def check(bar: Progress, c: Clock) -> None:
        left, untimed = bar.estimate()
        if c.now >= end / 4 and not untimed:
            errors.append(abs(left - (end - c.now)) / max(end - c.now, 1e-9))

    bar = Progress(cfg, specs, clock=clock, enabled=False)
    simulate(bar, clock, cfg, specs, check)
    assert errors and max(errors[:-1]) <= 0.25  # within 25% of the truth once all are timed


def test_a_unit_not_timed_yet_gives_a_lower_bound_that_names_it():
    cfg = resolve_config("offline", iterations=10, eval_every=5, methods=["ppo", "cory"],
                         seeds=[0])
    specs = [RunSpec("sentiment", "ppo", 0), RunSpec("sentiment", "cory", 0)]
    clock, out = Clock(), io.StringIO()
    bar = Progress(cfg, specs, clock=clock, stream=out)
    bar.begin(specs[0].key, 0)
    clock.now = 10.0
    bar.unit(specs[0].key, "evaluation")
    clock.now = 12.0
    bar.unit(specs[0].key, "iteration")
    line = bar.line()
    assert "runs 0 done, 1 running, 1 waiting" in line and "iterations 1/20" in line
    # no evaluation after the start is timed: a lower bound naming them
    assert "at least" in line and "ppo evaluation" in line and "cory evaluation" in line
    clock.now = 20.0
    bar.unit(specs[0].key, "evaluation")
    left, untimed = bar.estimate()  # cory's units borrow ppo's cost, x2 for its two models
    assert untimed == ["cory evaluation (scaled)", "cory iteration (scaled)",
                       "cory start (scaled)"]
    # ppo: 9 iterations x 2 s + 1 evaluation x 8 s; cory: 10 x 4 + 2 x 16 + its start 20
    assert left == 9 * 2 + 1 * 8 + 10 * (2 * 2) + 2 * (2 * 8) + 1 * (2 * 10)
    assert "scaled from a timed method" in bar.line()
    assert out.getvalue().startswith("runs 0 done")  # a log gets the line, not a redraw


def test_parallel_runs_share_the_time_left():
    cfg = resolve_config("offline", iterations=10, eval_every=5, methods=["ppo"], seeds=[0, 1])
    specs = [RunSpec("sentiment", "ppo", s) for s in (0, 1)]
    one, two = Clock(), Clock()
    a = Progress(cfg, specs, capacity=1, clock=one, enabled=False)
    b = Progress(cfg, specs, capacity=2, clock=two, enabled=False)
    for bar, clock in ((a, one), (b, two)):
        bar.begin(specs[0].key, 0)
        for kind in ("evaluation", "iteration", "iteration", "evaluation"):
            clock.now += 4.0
            bar.unit(specs[0].key, kind)
    assert a.estimate()[0] == 2 * b.estimate()[0] > 0


def test_the_last_line_says_the_study_ended():
    """The line written at the end counts every run done and none running, in a log too
    (written then, however soon after the line before)."""
    cfg = resolve_config("offline", iterations=30, eval_every=5, methods=["ppo"], seeds=[0])
    specs = [RunSpec("sentiment", "ppo", 0)]
    clock, out = Clock(), io.StringIO()
    bar = Progress(cfg, specs, clock=clock, stream=out)
    simulate(bar, clock, cfg, specs)
    bar.ended(specs[0].key)
    bar.close()
    assert out.getvalue().splitlines()[-1].startswith("runs 1 done, 0 running, 0 waiting")
