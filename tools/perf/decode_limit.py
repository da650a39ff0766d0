"""The default path's decode step, rollout and alone evaluation against their limits.

    python tools/perf/decode_limit.py                          # both real models
    python tools/perf/decode_limit.py --models smollm2-135m --threads 2 --steps 20

A cached decode step of a small batch reads every weight once and does little arithmetic per
byte, so its floor is the weights' bytes over the machine's copy bandwidth, not its FLOP rate.
This measures, in one process per model: the copy bandwidth (a large tensor copied, bytes
read and written per second), the bytes of weights a step reads (as stored, and as the bf16
the study's autocast computes in), one decode step of the study's setting (LoRA r 16, bf16,
batch 16) on the path `TrainConfig`'s default `decode` gives it, a rollout's decoding (12 new
tokens) and an alone evaluation's (--alone queries in batches of 64), each against its limit.
Where the CPU's bf16 products are slower than its memory, a step is bound by arithmetic: the
compute floor is the step's multiply-adds (2 x weights x rows) at the rate of a large bf16
product measured in the same process, and the floor is the larger of the two. On the fast
path the step's matrix products alone are timed too (`products_ms`). The last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def copy_bandwidth(mb: int = 512, rounds: int = 5) -> float:
    """Bytes moved per second (read + written) by a large float32 copy, the best of `rounds`:
    what the memory streams when every core works on it."""
    import torch

    src = torch.ones(mb * 2 ** 20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = max(best, 2 * src.numel() * 4 / (time.perf_counter() - t0))
    return best


def bf16_rate(n: int = 2048, rounds: int = 5) -> float:
    """Multiply-adds per second (counted as 2 FLOPs) of a large bf16 product, the best of
    `rounds`: the most the CPU's arithmetic gives a matrix product."""
    import torch

    a, b = torch.randn(n, n).bfloat16(), torch.randn(n, n).bfloat16()
    a @ b
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best


def products_time(engine, batch: int, rounds: int = 20) -> float:
    """Seconds of one step's matrix products alone on the fast path (every packed matrix and
    the head, at `batch` rows), the median of `rounds`."""
    import torch

    from agents.llm.engine import linear

    hidden = engine.embed.shape[1]
    inner = engine.policy.hf_model.config.get_text_config().intermediate_size
    width = {"qkv": hidden, "o": engine.heads * engine.head_dim, "gate_up": hidden,
             "down": inner}
    x = {k: torch.randn(batch, n).bfloat16() for k, n in width.items()}
    pairs = [(x[k], layer[k]) for layer in engine.layers for k in width]
    pairs.append((x["qkv"], engine.head))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for a, w in pairs:
            linear(a, w)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def decode_times(policy, batch: int, steps: int, prompt: int = 24) -> list[float]:
    """Seconds of each of `steps` cached decode steps after a warm-up, at `batch` rows."""
    import torch

    ids = torch.randint(100, 1000, (batch, prompt))
    state = policy.begin(ids, torch.ones_like(ids), max_new_tokens=steps + 8)
    token = torch.randint(100, 1000, (batch,))
    for _ in range(3):
        policy.feed(state, token)
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        policy.feed(state, token)
        out.append(time.perf_counter() - t0)
    return out


def measure(model: str, threads: int, steps: int, alone: int) -> dict:
    """One model's figures (run in a child process)."""
    import torch

    torch.set_num_threads(threads)
    from agents.llm.engine import attach
    from agents.llm.loading import LoraSettings
    from agents.llm.policy import LLMPolicy
    from agents.training.config import TrainConfig
    from cory_common.pretrained import resolve_model

    policy = LLMPolicy.from_pretrained(resolve_model(model), lora=LoraSettings(r=16),
                                       mixed_precision="bf16", reference=None)
    path = attach(policy, TrainConfig().decode)
    params = list(policy.hf_model.parameters())
    stored = sum(p.numel() * p.element_size() for p in params)
    bf16 = sum(p.numel() * 2 for p in params)
    bandwidth, rate = copy_bandwidth(), bf16_rate()
    step = statistics.median(decode_times(policy, 16, steps))
    limit = bf16 / bandwidth
    compute = 2 * (bf16 / 2) * 16 / rate  # every weight once per row, at the product's rate
    floor = max(limit, compute)
    row = {"model": model, "threads": threads, "path": path,
           "params_M": round(sum(p.numel() for p in params) / 1e6, 1),
           "weights_MB_stored": round(stored / 1e6), "weights_MB_bf16": round(bf16 / 1e6),
           "copy_GBps": round(bandwidth / 1e9, 1), "bf16_GFLOPps": round(rate / 1e9),
           "step_ms": round(1e3 * step, 1), "limit_ms_bf16": round(1e3 * limit, 1),
           "limit_ms_stored": round(1e3 * stored / bandwidth, 1),
           "compute_floor_ms": round(1e3 * compute, 1), "floor_ms": round(1e3 * floor, 1),
           "step_over_limit": round(step / limit, 2), "step_over_floor": round(step / floor, 2)}
    if policy.engine is not None:
        policy.engine.refresh()
        row["products_ms"] = round(1e3 * products_time(policy.engine, 16), 1)
    row["rollout_decode_s"] = round(12 * step, 2)  # 12 new tokens at batch 16
    row["rollout_limit_s"] = round(12 * limit, 2)
    if alone:
        batches = -(-alone // 64)
        t64 = statistics.median(decode_times(policy, 64, max(steps // 2, 5)))
        row["alone_decode_s"] = round(batches * 12 * t64, 1)
        row["alone_limit_s"] = round(batches * 12 * limit, 1)
        row["alone_step_ms_batch64"] = round(1e3 * t64, 1)
    return row


def model_parser(doc: str, decode: bool = True) -> argparse.ArgumentParser:
    """The options of a per-model measurement: --models, --threads, with `decode` --steps and
    --alone (and the internal --child of `each_model`)."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m,gemma3-270m")
    p.add_argument("--threads", type=int, default=2)
    if decode:
        p.add_argument("--steps", type=int, default=20)
        p.add_argument("--alone", type=int, default=256, help="held-out queries answered alone")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p


def per_model(script: str, parser: argparse.ArgumentParser, measure) -> None:
    """A per-model tool's main: as a child, print `measure(model, **options)`; else run each of
    --models in its own process with the same options and print their rows as one JSON line."""
    a = parser.parse_args()
    options = {k: v for k, v in vars(a).items() if k not in ("models", "child")}
    if a.child:
        print(json.dumps(measure(a.child, **options)))
        return
    args = [x for k, v in options.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    print(json.dumps({"rows": each_model(script, a.models.split(","), args)}))


def main() -> None:
    """Measure each model in its own process; print the JSON line."""
    per_model(__file__, model_parser(__doc__), measure)


def each_model(script: str, models: list[str], args: list[str]) -> list[dict]:
    """`script --child MODEL ARGS` in a fresh process per model; each one's last JSON line
    (printed as it comes). A child that fails stops the run with its error."""
    rows = []
    for model in models:
        out = subprocess.run([sys.executable, script, "--child", model, *args],
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"{model}: {out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main()
