"""A study's progress across its runs, and the time it has left, estimated from what each unit
of work has cost so far.

Units are a run's start (loading its models, then its first evaluation or iteration), a
training iteration and an alone evaluation. Their costs differ by method (a CORY iteration
trains two models; an evaluation answers hundreds of queries), so each is timed per method and
kind as the runs send their messages, and the time left is the median cost of each unit still
to do, summed over the runs left and shared among the runs that execute at once.
A method not timed yet borrows the cost of one that is, scaled by the models each trains per
episode (`run_weight`: a CORY iteration trains two models, PPO's one), and the line says so;
with no unit of a kind timed at all it gives only a lower bound and names what is missing.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict

from benchmarks.settings.config import BenchConfig, RunSpec, run_weight
from benchmarks.study.evaluate import evaluation_due


def _clock(seconds: float) -> str:
    """Seconds as 3m05s or 1h02m."""
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s"


class Progress:
    """Runs done / running / waiting, iterations done, and the time left, on one line (stderr;
    redrawn in place on a terminal, a line every 5 s in a log)."""

    def __init__(self, cfg: BenchConfig, specs: list[RunSpec], capacity: int = 1,
                 stream=None, enabled: bool = True, clock=time.monotonic):
        self.cfg, self.capacity, self.clock = cfg, max(capacity, 1), clock
        self.stream, self.enabled = stream or sys.stderr, enabled
        self.method = {s.key: s.method for s in specs}
        self.weight = {m: run_weight(m) for m in set(self.method.values())}
        self.left: dict[str, list[int]] = {s.key: self._work(0) for s in specs}
        self.fresh: set[str] = set()  # begun, first unit not come yet
        self.costs: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.last: dict[str, float] = {}
        self.running: set[str] = set()
        self.done: set[str] = set()
        self.start, self.last_line = clock(), -1e9

    def _work(self, start: int) -> list[int]:
        """[iterations, evaluations, starts] a run has left from iteration `start` (its start
        holds the evaluation at `start`, if one is due)."""
        n = self.cfg.train.iterations
        evals = sum(evaluation_due(self.cfg, i) for i in range(start + 1, n + 1))
        return [n - start, evals, 1]

    def finished(self, key: str) -> None:
        """A run finished before this process started, or just now."""
        self.done.add(key)
        self.running.discard(key)
        self.left[key] = [0, 0, 0]

    def begin(self, key: str, start: int) -> None:
        """A run starts (or continues) at iteration `start`."""
        self.left[key] = self._work(start)
        self.running.add(key)
        self.fresh.add(key)
        self.last[key] = self.clock()

    def unit(self, key: str, kind: str) -> None:
        """A run finished one unit ("iteration" or "evaluation"): time it, count it, redraw."""
        now = self.clock()
        left = self.left[key]
        if key in self.fresh:  # the start: loading, then this first unit
            self.fresh.discard(key)
            left[2] = 0
            left[0] -= kind == "iteration"
            kind = "start"
        elif kind == "iteration":
            left[0] = max(0, left[0] - 1)
        else:
            left[1] = max(0, left[1] - 1)
        self.costs[(self.method[key], kind)].append(now - self.last.get(key, now))
        self.last[key] = now
        self.draw()

    def ended(self, key: str) -> None:
        """A run stopped (finished, failed or lost)."""
        self.running.discard(key)
        self.draw()

    def cost(self, method: str, kind: str) -> tuple[float | None, bool]:
        """(the median cost of a unit, whether it is borrowed from another method); None when
        no method has timed that kind yet."""
        seen = self.costs.get((method, kind))
        if seen:
            return statistics.median(seen), False
        timed = [(m, c) for (m, k), c in self.costs.items() if k == kind and c]
        if not timed:
            return None, False
        other, costs = max(timed, key=lambda mc: len(mc[1]))
        return statistics.median(costs) * self.weight[method] / self.weight[other], True

    def estimate(self) -> tuple[float, list[str]]:
        """(seconds left, the units still to do that are not timed: "(scaled)" when borrowed
        from another method, bare when nothing tells their cost)."""
        total, untimed = 0.0, set()
        for key, (iters, evals, starts) in self.left.items():
            for kind, count in (("iteration", iters), ("evaluation", evals), ("start", starts)):
                if not count:
                    continue
                unit, borrowed = self.cost(self.method[key], kind)
                if unit is None:
                    untimed.add(f"{self.method[key]} {kind}")
                    continue
                total += count * unit
                if borrowed:
                    untimed.add(f"{self.method[key]} {kind} (scaled)")
        waiting = sum(1 for k, w in self.left.items() if any(w) and k not in self.done)
        return total / max(1, min(self.capacity, waiting)), sorted(untimed)

    def line(self) -> str:
        """The progress line."""
        waiting = len(self.left) - len(self.done) - len(self.running)
        its = sum(self.cfg.train.iterations - w[0] for w in self.left.values())
        total_its = len(self.left) * self.cfg.train.iterations
        left, untimed = self.estimate()
        elapsed = self.clock() - self.start
        unknown = [u for u in untimed if not u.endswith("(scaled)")]
        if unknown:
            when = f"at least {_clock(left)} left (not timed yet: {', '.join(unknown[:3])})"
        elif untimed:
            when = (f"about {_clock(left)} left ({', '.join(u[:-9] for u in untimed[:2])} "
                    f"scaled from a timed method)")
        else:
            when = f"about {_clock(left)} left"
        return (f"runs {len(self.done)} done, {len(self.running)} running, {waiting} waiting; "
                f"iterations {its}/{total_its}; {_clock(elapsed)} elapsed, {when}")

    def draw(self, last: bool = False) -> None:
        """Redraw the line (a terminal) or write it every 5 s (a log); `last`: the final line,
        written whatever the time since the one before."""
        if not self.enabled:
            return
        line = self.line()
        if getattr(self.stream, "isatty", lambda: False)():
            self.stream.write("\r" + line[:160].ljust(160))
        elif last or self.clock() - self.last_line > 5:
            self.stream.write(line + "\n")
            self.last_line = self.clock()
        self.stream.flush()

    def close(self) -> None:
        """Write the final line (what finished, what did not), then end it."""
        self.draw(last=True)
        if self.enabled and getattr(self.stream, "isatty", lambda: False)():
            self.stream.write("\n")
