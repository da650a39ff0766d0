"""A process's torch threads: how many, and how a waiting thread waits. Nothing happens on import.

Each entry point calls `configure(threads)` once, first thing: every `python -m` command's
main, a study's local worker and Ray task, and the reference-model build child. A library user
may call it too (`from cory_common.threads import configure`), before importing torch if the
wait policy is to apply to this process.

The rule for the wait policy, one everywhere: OpenMP's default lets a waiting thread spin. On
an idle machine that is fastest; beside a busy core a spinning thread holds a core the thread
it waits for needs. One decode step of SmolLM2 (LoRA r 16, bf16, batch 16) at 2 threads on
2 cores, 2026-12-04: idle 51.8 ms spinning against 89.7 ms passive; beside one busy core
364 ms spinning against 74.7 ms passive (tools/perf/wait_policy.py; docs/performance.md). So
when other work holds more than half a core at the choice, threads wait passively
(OMP_WAIT_POLICY=PASSIVE); otherwise OpenMP keeps its own policy. A user's own
OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept, and child processes keep their parent's choice (a
study's other workers are not "other work").

OpenMP reads the policy once, when torch loads. A `python -m` command whose torch loaded
before the choice starts itself again once with the policy set (`restart=True`); elsewhere
the returned text says that the policy reaches only child processes.
"""

from __future__ import annotations

import os
import sys
import time

POLICY, SPIN = "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"
BUSY = 0.5  # cores held by other work from which waiting is passive
CHOSEN = "CORY_WAIT_CHOSEN"  # set once chosen: child processes keep their parent's choice


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


def wait_env(load: float) -> dict[str, str]:
    """The OpenMP wait settings for `load` busy cores: passive when other work holds more than
    half a core, else OpenMP's own."""
    return {POLICY: "PASSIVE"} if load > BUSY else {}


def wait_choice(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The wait variables a process started now should have: the ones already set (by the
    user, or by a parent that chose), else the rule's for the load now; CHOSEN marks them."""
    environ = os.environ if environ is None else environ
    if POLICY in environ or SPIN in environ or CHOSEN in environ:
        chosen = {k: environ[k] for k in (POLICY, SPIN) if k in environ}
    else:
        chosen = wait_env(busy_cores())
    return {**chosen, CHOSEN: "1"}


def _startup_env() -> dict[str, str]:
    """This process's environment as it started (what OpenMP read if torch loaded early)."""
    try:
        with open(f"/proc/{os.getpid()}/environ", "rb") as f:
            pairs = (p.decode(errors="replace").partition("=") for p in f.read().split(b"\0") if p)
            return {k: v for k, _, v in pairs}
    except OSError:  # no /proc: the environment now, so nothing restarts
        return dict(os.environ)


def policy_in_force() -> str | None:
    """OMP_WAIT_POLICY as this process's OpenMP reads it: as the process started once torch
    has loaded, else as it is now."""
    return (_startup_env() if "torch" in sys.modules else os.environ).get(POLICY)


def _in_words(env: dict[str, str]) -> str:
    """The wait policy of `env`, in words."""
    return env.get(POLICY) or (f"{SPIN}={env[SPIN]}" if SPIN in env else "OpenMP's default")


def started_as(module: str) -> bool:
    """Whether this process is `python -m module` (a package's __main__ included)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name in (module, f"{module}.__main__")


_LATE: list[str] = []  # the policy configure() chose after torch had loaded, if it did


def configure(threads: int | None = None, *, restart: bool = False) -> str:
    """Set this process's torch threads and wait policy once (the module docstring has the
    rule); return them in words, for a run's log line."""
    wanted = wait_choice()
    os.environ.update(wanted)
    if "torch" in sys.modules and _startup_env().get(POLICY) != wanted.get(POLICY):
        if restart:
            sys.stdout.flush()
            sys.stderr.flush()
            os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
        _LATE[:] = [_in_words(wanted)]
    import torch

    if threads:
        torch.set_num_threads(threads)
    return thread_setting()


def thread_setting(threads: int | None = None) -> str:
    """The torch thread count (`threads`, else this process's) and the wait policy in force,
    in words; changes nothing."""
    import torch

    if _LATE:
        policy = (f"{_in_words(_startup_env())} (torch loaded first: {_LATE[0]} reaches "
                  f"child processes only)")
    else:
        policy = _in_words(os.environ)
    return f"{threads or torch.get_num_threads()} torch thread(s), wait {policy}"
