"""How torch's CPU threads wait for work, chosen before torch starts its thread pool: from how
many cores other work keeps busy right now.

OpenMP's default lets a waiting thread spin. On an idle machine that is fastest; beside a busy
core a spinning thread holds a core the thread it waits for needs. One decode step of SmolLM2
(LoRA r 16, bf16, batch 16) at 2 threads on 2 cores, 2026-12-04: idle 51.8 ms spinning against
89.7 ms passive; beside one busy core 364 ms spinning against 74.7 ms passive
(tools/perf/wait_policy.py; docs/performance.md). So when other work holds a core at start,
the threads wait passively (OMP_WAIT_POLICY=PASSIVE); otherwise OpenMP keeps its own policy.
Every package of the project imports this module first; a user's own OMP_WAIT_POLICY or
GOMP_SPINCOUNT is kept, and a study's worker processes keep their coordinator's choice (the
other workers are not "other work").
"""

from __future__ import annotations

import os
import time

POLICY, SPIN = "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"
BUSY = 0.5  # cores held by other work from which waiting is passive


def busy_cores(seconds: float = 0.1) -> float:
    """How many cores other work keeps busy now (from /proc/stat over `seconds`; else the
    1-minute load average, which lags)."""
    def sample() -> list[int]:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]

    try:
        a = sample()
        time.sleep(seconds)
        b = sample()
    except (OSError, ValueError):
        return os.getloadavg()[0]
    delta = [y - x for x, y in zip(a, b)]
    idle = delta[3] + (delta[4] if len(delta) > 4 else 0)  # idle + iowait
    return (1 - idle / max(1, sum(delta))) * (os.cpu_count() or 1)


def wait_env(load: float, idle_spin: str | None = None) -> dict[str, str]:
    """The OpenMP wait settings for `load` busy cores: passive when other work holds a core,
    else OpenMP's own spinning (bounded to `idle_spin` rounds when given)."""
    if load > BUSY:
        return {POLICY: "PASSIVE"}
    return {SPIN: idle_spin} if idle_spin else {}


CHOSEN = "CORY_WAIT_CHOSEN"  # set once chosen: a study's workers keep their parent's choice


def choose_wait_policy() -> str:
    """Set the wait policy for this process from the load now, unless one is set already (by
    the user, or by the parent of this worker); return what is in force (OpenMP reads it when
    torch loads: later changes do nothing)."""
    if POLICY not in os.environ and SPIN not in os.environ and CHOSEN not in os.environ:
        os.environ.update(wait_env(busy_cores()))
    os.environ[CHOSEN] = "1"
    return os.environ.get(POLICY) or (f"{SPIN}={os.environ[SPIN]}" if SPIN in os.environ
                                      else "OpenMP's default")


def thread_setting() -> str:
    """The torch thread count and wait policy, for a run's log line."""
    import torch

    return f"{torch.get_num_threads()} torch thread(s), wait {choose_wait_policy()}"


choose_wait_policy()
