"""One decode step of the study's setting, idle and beside a busy core, by thread count and
OpenMP wait policy: what `cory_common.threads` chooses.

    python tools/perf/wait_policy.py                  # SmolLM2-135M, LoRA r 16, bf16, batch 16
    python tools/perf/wait_policy.py --threads 2 --policies default,PASSIVE,spin:10000,auto

Each measurement is a fresh process that sets the policy before torch loads: `default` (none
set: OpenMP's own spinning), `PASSIVE`, `spin:N` (GOMP_SPINCOUNT=N) or `auto` (what the
project chooses from the load, `cory_common.threads`), then times --steps cached decode steps
after a warm-up; "busy" runs one spinning process beside it. The last line is one JSON
object: per load, threads and policy, the median and best step in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r'''
import os, sys, time, statistics
policy = sys.argv[1]
os.environ.pop("OMP_WAIT_POLICY", None)
os.environ.pop("GOMP_SPINCOUNT", None)
if policy.startswith("spin"):  # spin:N -- OpenMP's own policy, spinning N rounds at most
    os.environ["GOMP_SPINCOUNT"] = policy.split(":")[1]
elif policy == "auto":
    import cory_common.threads  # chooses from the load now
elif policy != "default":
    os.environ["OMP_WAIT_POLICY"] = policy
import torch  # OpenMP reads the policy now
torch.set_num_threads(int(sys.argv[2]))
from agents.llm.loading import LoraSettings
from agents.llm.policy import LLMPolicy
from cory_common.pretrained import resolve_model
policy_ = LLMPolicy.from_pretrained(resolve_model(sys.argv[4]), lora=LoraSettings(r=16),
                                    mixed_precision="bf16", reference=None)
ids = torch.randint(100, 1000, (16, 24))
state = policy_.begin(ids, torch.ones_like(ids), max_new_tokens=int(sys.argv[3]) + 8)
token = torch.randint(100, 1000, (16,))
for _ in range(3):
    policy_.feed(state, token)
times = []
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter()
    policy_.feed(state, token)
    times.append(1000 * (time.perf_counter() - t0))
print(statistics.median(times), min(times))
'''

BUSY = "import time\nend = time.time() + 600\nwhile time.time() < end:\n    pass\n"


def step_ms(policy: str, threads: int, steps: int, model: str) -> tuple[float, float]:
    """(median, best) decode-step milliseconds in a fresh process."""
    out = subprocess.run([sys.executable, "-c", CHILD, policy, str(threads), str(steps), model],
                         capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items()
                              if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                                           "CORY_WAIT_CHOSEN")})
    median, best = (float(x) for x in out.stdout.split()[-2:])
    return round(median, 1), round(best, 1)


def main() -> None:
    """Measure every combination and print the JSON line."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--policies", default="default,PASSIVE")
    p.add_argument("--loads", default="idle,busy")
    a = p.parse_args()
    rows = []
    for load in a.loads.split(","):
        busy = subprocess.Popen([sys.executable, "-c", BUSY]) if load == "busy" else None
        try:
            time.sleep(0.5 if busy else 0)
            for threads in (int(t) for t in a.threads.split(",")):
                for policy in a.policies.split(","):
                    median, best = step_ms(policy, threads, a.steps, a.model)
                    rows.append({"load": load, "threads": threads, "policy": policy,
                                 "median_ms": median, "best_ms": best})
                    print(rows[-1], flush=True)
        finally:
            if busy:
                busy.kill()
    print(json.dumps({"model": a.model, "cores": os.cpu_count(), "rows": rows}))


if __name__ == "__main__":
    main()
