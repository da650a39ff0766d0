"""Candidates for a faster decode step, measured before any is chosen (one process each).

    python tools/perf/decode_candidates.py --model smollm2-135m --threads 2

Each candidate loads the study's policy (LoRA r 16 on one base, bf16 autocast, batch 16) and
times --steps cached decode steps after a warm-up:
- `study`: the study's path as it is (float32 weights, LoRA wrappers, bf16 autocast);
- `merged`: the LoRA adapter merged into the weights for decoding (peft's merge_adapter: no
  adapter matmuls; what folding would gain, the wrappers' Python aside);
- `no-lora`: the base model alone, no adapter wrappers at all (folding's upper bound);
- `bf16-weights`: the study's path with every weight held in bf16 (fewer bytes streamed);
- `engine`: the fast decode path (`agents.llm.engine`: folded bf16 matrices, one functional
  forward over a static cache).
The last line is one JSON object: per candidate the median and best step in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from decode_limit import decode_times  # noqa: E402  (the one timed decode loop)

CANDIDATES = ("study", "merged", "no-lora", "bf16-weights", "engine")


def step_ms(candidate: str, model: str, threads: int, steps: int) -> tuple[float, float]:
    """(median, best) ms of a decode step for one candidate (run in this process)."""
    import torch

    torch.set_num_threads(threads)
    from agents.llm.loading import LoraSettings
    from agents.llm.policy import LLMPolicy
    from cory_common.pretrained import resolve_model

    lora = None if candidate == "no-lora" else LoraSettings(r=16)
    policy = LLMPolicy.from_pretrained(resolve_model(model), lora=lora, mixed_precision="bf16",
                                       reference=None)
    if candidate == "bf16-weights":
        policy.hf_model.to(torch.bfloat16)
    if candidate == "merged":
        policy.model.merge_adapter()  # the peft model: W + B A scale, adapters then skipped
    if candidate == "engine":
        from agents.llm.engine import DecodeEngine

        policy.engine = DecodeEngine(policy)
    times = decode_times(policy, 16, steps)
    return round(1e3 * statistics.median(times), 1), round(1e3 * min(times), 1)


def main() -> None:
    """Each candidate in its own process; print the JSON line."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(step_ms(a.child, a.model, a.threads, a.steps)))
        return
    rows = {}
    for candidate in a.candidates.split(","):
        out = subprocess.run([sys.executable, __file__, "--child", candidate, "--model", a.model,
                              "--threads", str(a.threads), "--steps", str(a.steps)],
                             capture_output=True, text=True)
        if out.returncode:
            rows[candidate] = {"error": out.stderr.strip().splitlines()[-1][:200]}
        else:
            median, best = json.loads(out.stdout.strip().splitlines()[-1])
            rows[candidate] = {"median_ms": median, "best_ms": best}
        print(candidate, rows[candidate], flush=True)
    print(json.dumps({"model": a.model, "threads": a.threads, "candidates": rows}))


if __name__ == "__main__":
    main()
