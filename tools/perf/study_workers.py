"""A study's wall time and peak memory, one process against N workers (or any options against
others), in one sitting.

    python tools/perf/study_workers.py --study "--quick --seeds 0,1,2" --variants "1:0,2:1"
    python tools/perf/study_workers.py --study "--preset real-demo --methods ppo,cory" \
        --variants "1:2,2:1"          # WORKERS:THREADS (0: the study's own --threads)
    python tools/perf/study_workers.py --study "--preset real-demo --methods cory \
        --iterations 6 --threads 1" --compare "--decode exact|--decode fast"

Each variant runs `python -m benchmarks.run STUDY --workers W [--threads T]` (or `STUDY
OPTIONS` for each of --compare's) in a fresh folder, alternating variants over --repeats
rounds; the whole process tree's resident memory is sampled every 0.2 s. Prints one JSON line:
per variant the wall seconds of each round and the peak memory, and each variant's median
wall time over the first's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of a process and all its descendants."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def timed(args: list[str]) -> tuple[float, int]:
    """(wall seconds, peak tree memory in bytes) of one command."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watch, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(watch))
        time.sleep(0.2)
    if proc.returncode:
        raise SystemExit(f"{shlex.join(args)} failed:\n{proc.stderr.read().decode()[-2000:]}")
    return time.perf_counter() - start, peak


def main() -> None:
    """Run the variants alternately and print the JSON line."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", default="--quick --seeds 0,1,2", help="benchmarks.run options")
    p.add_argument("--variants", default="1:0,2:1", help="WORKERS:THREADS,...")
    p.add_argument("--compare", help="instead of --variants: '|'-separated option strings, "
                   "each a variant added to the study's options")
    p.add_argument("--repeats", type=int, default=1)
    a = p.parse_args()
    if a.compare:
        variants = {v.strip(): shlex.split(v) for v in a.compare.split("|")}
    else:
        variants = {}
        for v in a.variants.split(","):
            w, t = (int(x) for x in v.split(":"))
            variants[f"{w}x{t}"] = ["--workers", str(w)] + (["--threads", str(t)] if t else [])
    out = {name: {"wall_s": [], "peak_gb": 0.0} for name in variants}
    for _ in range(a.repeats):
        for name, extra in variants.items():
            with tempfile.TemporaryDirectory() as tmp:
                wall, peak = timed([sys.executable, "-m", "benchmarks.run",
                                    *shlex.split(a.study), *extra, "--no-progress",
                                    "--out", f"{tmp}/run"])
            row = out[name]
            row["wall_s"].append(round(wall, 1))
            row["peak_gb"] = round(max(row["peak_gb"], peak / 2 ** 30), 2)
    first = statistics.median(next(iter(out.values()))["wall_s"])
    for row in out.values():
        row["ratio_to_first"] = round(statistics.median(row["wall_s"]) / first, 3)
    print(json.dumps({"study": a.study, "cores": psutil.cpu_count(), "variants": out}))


if __name__ == "__main__":
    main()
