"""A study's wall time against its workers, simulated from a finished study folder's log.

    python tools/perf/study_scaling.py docs/fidelity/real --workers 1,2,8,32 --slowdown 1.0

Each run's time is read from log.txt (from the event before it to its "finished" line, for runs
that ran without a resume), as a median per method; every run of the folder's settings is then
placed on W workers, the costliest first, each on the first worker free (what
`benchmarks.study.recorder` does). `--slowdown` multiplies each run's time (a run on fewer
threads than the folder's). Prints one JSON line: per method the median run time, and per W
the study's simulated wall time and its ratio to one worker.
"""

from __future__ import annotations

import argparse
import heapq
import json
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (.*)$")


def run_times(log: str) -> dict[str, float]:
    """Seconds of each run that went from its start to its end in one sitting."""
    out, last, resumed = {}, None, set()
    for line in log.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        when, text = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"), m.group(2)
        if text.startswith(("starting", "resuming")):
            last = when
        elif ": resumed from iteration" in text:
            resumed.add(text.split(":")[0])
        elif text.endswith(": finished"):
            key = text.split(":")[0]
            if last is not None and key not in resumed:
                out[key] = (when - last).total_seconds()
            last = when
    return out


def simulate(times: list[float], workers: int) -> float:
    """Wall time of runs placed costliest first, each on the first free worker."""
    free = [0.0] * workers
    for t in sorted(times, reverse=True):
        start = heapq.heappop(free)
        heapq.heappush(free, start + t)
    return max(free)


def main() -> None:
    """Read the folder, simulate, print the JSON line."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder")
    p.add_argument("--workers", default="1,2,8,32")
    p.add_argument("--slowdown", type=float, default=1.0)
    a = p.parse_args()
    folder = Path(a.folder)
    config = json.loads((folder / "run_config.json").read_text())
    measured = run_times((folder / "log.txt").read_text())
    per_method = {}
    for method in config["methods"]:
        seen = [t for k, t in measured.items() if f"-{method}-seed" in k
                and k.split("-seed")[0].endswith(method)]
        if seen:
            per_method[method] = statistics.median(seen)
    runs = [per_method[m] * a.slowdown for m in config["methods"] for _ in config["seeds"]
            for _ in config["tasks"] if m in per_method]
    one = simulate(runs, 1)
    out = {"folder": str(folder), "runs": len(runs), "slowdown": a.slowdown,
           "median_run_s": {m: round(t) for m, t in per_method.items()}, "workers": {}}
    for w in (int(x) for x in a.workers.split(",")):
        wall = simulate(runs, w)
        out["workers"][w] = {"wall_h": round(wall / 3600, 2), "ratio": round(wall / one, 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
