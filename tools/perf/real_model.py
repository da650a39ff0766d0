"""Where a real model's iteration goes, against its hardware floor and TRL 0.11.

    python tools/perf/real_model.py                       # SmolLM2-135M, reviews, PPO + CORY
    python tools/perf/real_model.py --settings fast --methods cory --iters 2
    python tools/perf/real_model.py --settings fast --alone 256   # and the alone evaluation

Times each phase of a training iteration (decoding, the reference pass, the full pass that
bf16 needs, the update, the rest: env, rewards, metrics) at batch 16, 12 new tokens, 4 PPO
epochs of one mini-batch, in two settings: "fast" (the study's: LoRA r 16, bf16 autocast) and
"full" (float32 full fine-tuning, the TRL anchor's). It counts the matmul FLOPs each phase
needs from the tokens it processed and measures this machine's bf16 and fp32 matmul
throughput on the same threads: the floor of an iteration is its FLOPs over that throughput.
Each measurement runs in its own process (its own peak RSS), next to TRL 0.11.4's PPOTrainer
and the official CORY recipe on the same model folder and workload (`tools/perf/trl_anchor.py`
in the venv `make perf-trl-venv` builds). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

if __package__ in (None, ""):  # `python tools/perf/real_model.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import agents.llm.rollout as rollout_module
from agents.learners.ppo_config import PPOConfig
from agents.llm.loading import LoraSettings
from agents.llm.policy import LLMPolicy
from agents.llm.rollout import answer_alone
from agents.training.config import TrainConfig
from agents.training.train import Trainer
from cory_common.pretrained import resolve_model
from cory_env import BatchedCoryEnv

TRL_PYTHON = Path(__file__).resolve().parents[2] / ".venv-trl" / "bin" / "python"


def matmul_tflops(dtype: torch.dtype, n: int = 1536, repeats: int = 8, rounds: int = 6) -> float:
    """Measured TFLOP/s of an n x n x n matmul in `dtype` on the current threads (the best
    of `rounds`: a machine's throughput, not its noise)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # warm-up
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = max(best, 2 * n ** 3 * repeats / (time.perf_counter() - t0) / 1e12)
    return best


def model_flops(policy) -> tuple[float, float]:
    """Matmul FLOPs per token: (the layers, the LM head), 2 per weight (LoRA included)."""
    hf = policy.hf_model
    head = hf.get_output_embeddings().weight.numel()
    layers = sum(m.weight.numel() for name, m in hf.named_modules()
                 if isinstance(m, torch.nn.Linear) and m is not hf.get_output_embeddings())
    return 2.0 * layers, 2.0 * head


class Clock:
    """Wall time and matmul FLOPs per phase, filled by wrapped methods."""

    def __init__(self):
        self.seconds, self.flops = defaultdict(float), defaultdict(float)

    @contextlib.contextmanager
    def phase(self, name: str, flops: float = 0.0):
        t0 = time.perf_counter()
        yield
        self.seconds[name] += time.perf_counter() - t0
        self.flops[name] += flops


def instrument(clock: Clock, per_token: tuple[float, float], backward: int) -> None:
    """Wrap the passes of LLMPolicy and the rollout so each adds its time and FLOPs
    (`backward`: the backward's FLOPs over the forward's; 1 for input gradients only, 2 with
    weight gradients)."""
    layers, head = per_token
    begin, feed, ref = LLMPolicy.begin, LLMPolicy.feed, LLMPolicy.reference_logits
    full, evaluate = rollout_module.full_pass, LLMPolicy.evaluate

    def tokens(mask) -> float:
        return float(mask.sum())

    def timed_begin(self, ids, mask, *a, **kw):
        with clock.phase("decode", tokens(mask) * layers + mask.shape[0] * head):
            return begin(self, ids, mask, *a, **kw)

    def timed_feed(self, state, token, active=None):
        n = float(active.sum()) if active is not None else token.numel()
        with clock.phase("decode", n * (layers + head)):
            return feed(self, state, token, active)

    def timed_ref(self, ids, mask, T, *a, **kw):
        with clock.phase("reference", tokens(mask) * layers + tokens(mask[:, -T:]) * head):
            return ref(self, ids, mask, T, *a, **kw)

    def timed_full(policy, ids, mask, T, sampling):
        with clock.phase("full pass", tokens(mask) * layers + tokens(mask[:, -T:]) * head):
            return full(policy, ids, mask, T, sampling)

    def timed_evaluate(self, ids, mask, n_response, *a, **kw):  # the update's passes
        if torch.is_grad_enabled():  # forward + backward
            T = n_response
            clock.flops["update"] += (1 + backward) * (tokens(mask) * layers
                                                       + tokens(mask[:, -T:]) * head)
        return evaluate(self, ids, mask, n_response, *a, **kw)

    LLMPolicy.begin, LLMPolicy.feed = timed_begin, timed_feed
    LLMPolicy.reference_logits, LLMPolicy.evaluate = timed_ref, timed_evaluate
    rollout_module.full_pass = timed_full


SETTINGS = {"fast": "LoRA r 16 + bf16 autocast (the study's)",
            "full": "full float32 fine-tuning (the TRL anchor's)"}


def measure(method: str, setting: str, args, tput: dict) -> dict:
    """Time `args.iters` iterations of one method after one warm-up; the phases and floors."""
    fast = setting == "fast"
    cfg = TrainConfig(task=args.task, method=method, model=args.model, batch_size=args.batch_size,
                      iterations=args.iters + 1, max_new_tokens=args.max_new_tokens,
                      lora=LoraSettings(r=16) if fast else None,
                      mixed_precision="bf16" if fast else None, torch_compile=args.compile,
                      ppo=PPOConfig(lr=5e-4, mini_batch_size=args.batch_size, ppo_epochs=4))
    trainer = Trainer(cfg)
    t0 = time.perf_counter()
    trainer.step()  # warm-up: first-call costs (compiling too) are not an iteration's
    warmup = time.perf_counter() - t0
    clock = Clock()
    instrument(clock, model_flops(trainer.learner.policies["llm_0"]), backward=1 if fast else 2)
    t0 = time.perf_counter()
    for _ in range(args.iters):
        m = trainer.step()
        clock.seconds["update"] += m["time_update_s"]
    total = (time.perf_counter() - t0) / args.iters
    peak = tput["bf16" if fast else "fp32"] * 1e12
    phases = {name: phase_row(clock.seconds[name] / args.iters,
                              clock.flops[name] / args.iters, peak)
              for name in ("decode", "reference", "full pass", "update")}
    rest = total - sum(p["s"] for p in phases.values())
    phases["rest (env, rewards, metrics)"] = {"s": round(rest, 3), "gflop": 0, "floor_s": 0}
    floor = sum(p["floor_s"] for p in phases.values())
    return {"method": method, "setting": setting, "warmup_s": round(warmup, 1),
            "s_per_iteration": round(total, 3), "floor_s": round(floor, 3),
            "times_floor": round(total / floor, 2), "phases": phases,
            "alone": alone_evaluation(trainer, args.alone, clock, peak) if args.alone else None,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


def phase_row(seconds: float, flops: float, peak: float) -> dict:
    """One phase's row: its seconds, GFLOP and floor at `peak` FLOP/s."""
    return {"s": round(seconds, 3), "gflop": round(flops / 1e9, 1),
            "floor_s": round(flops / peak, 3)}


def alone_evaluation(trainer: Trainer, n: int, clock: Clock, peak: float) -> dict:
    """Time the study's alone evaluation of one model: n held-out queries answered in batches
    of 64 with their exact KL (`benchmarks/study/evaluate.py`); its phases and floor."""
    env = BatchedCoryEnv(batch_size=64, task=trainer.env.task, tokenizer=trainer.env.tokenizer,
                         max_new_tokens=trainer.env.max_new_tokens, split="test",
                         n_agents=1, seed=0)
    seconds, flops = dict(clock.seconds), dict(clock.flops)
    t0 = time.perf_counter()
    answer_alone(env, trainer.learner.policies["llm_0"], trainer.cfg.sampling,
                 torch.Generator().manual_seed(0), list(range(n)))
    total = time.perf_counter() - t0
    phases = {name: phase_row(clock.seconds[name] - seconds.get(name, 0),
                          clock.flops[name] - flops.get(name, 0), peak)
              for name in ("decode", "reference", "full pass")}
    floor = sum(p["floor_s"] for p in phases.values())
    return {"queries": n, "s": round(total, 3), "floor_s": round(floor, 3),
            "times_floor": round(total / floor, 2), "phases": phases}


def show_phases(phases: dict, indent: int = 2) -> None:
    """Print one line per phase: seconds, GFLOP and floor."""
    for name, ph in phases.items():
        print(f"{' ' * indent}{name:<30} {ph['s']:7.3f} s  {ph['gflop']:8.1f} GFLOP  floor "
              f"{ph['floor_s']:.3f} s")


def child(cmd: list[str], timeout: float) -> dict | None:
    """Run one measurement in its own process (its own peak RSS); its last line's JSON."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  timed out: {' '.join(cmd)}")
        return None
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode or not lines:
        print(f"  failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}")
        return None
    return json.loads(lines[-1])


def main(argv=None) -> dict:
    """Measure the throughput, then each method in its own process; a table and a JSON line."""
    p = argparse.ArgumentParser(prog="python tools/perf/real_model.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="reviews")
    p.add_argument("--methods", default="ppo,cory")
    p.add_argument("--settings", default="fast,full", help=f"of {', '.join(SETTINGS)}")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--iters", type=int, default=3, help="timed iterations (after one warm-up)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="torch.compile the training passes")
    p.add_argument("--alone", type=int, default=0, metavar="N",
                   help="also time the study's alone evaluation of N held-out queries (256)")
    p.add_argument("--trl-python", default=str(TRL_PYTHON) if TRL_PYTHON.exists() else None,
                   type=lambda s: None if s == "none" else s,
                   help="the TRL 0.11.4 venv's python (make perf-trl-venv); none: no anchor")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    p.add_argument("--child", nargs=2, metavar=("METHOD", "SETTING"), help=argparse.SUPPRESS)
    p.add_argument("--tflops", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.child:
        print(json.dumps(measure(*args.child, args, json.loads(args.tflops))))
        return {}
    tput = {"bf16": matmul_tflops(torch.bfloat16), "fp32": matmul_tflops(torch.float32)}
    print(f"matmul throughput on {args.threads} threads: bf16 {tput['bf16']:.2f} TFLOP/s, "
          f"fp32 {tput['fp32']:.2f} TFLOP/s")
    folder = resolve_model(args.model)
    out = {"model": args.model, "threads": args.threads, "batch_size": args.batch_size,
           "max_new_tokens": args.max_new_tokens,
           "tflops": {k: round(v, 3) for k, v in tput.items()}, "runs": [], "trl": []}
    common = ["--model", args.model, "--task", args.task, "--batch-size", str(args.batch_size),
              "--max-new-tokens", str(args.max_new_tokens), "--iters", str(args.iters),
              "--threads", str(args.threads), "--alone", str(args.alone),
              "--tflops", json.dumps(tput)]
    common += ["--compile"] if args.compile else []
    for method in args.methods.split(","):  # ours, then the anchor's same method: same load
        for setting in args.settings.split(","):
            r = child([sys.executable, __file__, "--child", method, setting, *common],
                      args.timeout)
            if r is None:
                continue
            out["runs"].append(r)
            print(f"\n{method}, {SETTINGS[setting]}: {r['s_per_iteration']:.2f} s/iteration, "
                  f"floor {r['floor_s']:.2f} s ({r['times_floor']:.2f}x), peak RSS "
                  f"{r['peak_rss_mb']} MB")
            show_phases(r["phases"])
            if r.get("alone"):
                a = r["alone"]
                print(f"  alone evaluation of {a['queries']} queries: {a['s']:.2f} s, floor "
                      f"{a['floor_s']:.2f} s ({a['times_floor']:.2f}x)")
                show_phases(a["phases"], indent=4)
        if args.trl_python:
            t = child([args.trl_python, str(Path(__file__).with_name("trl_anchor.py")), folder,
                       "--mode", method, "--iters", str(args.iters), "--batch",
                       str(args.batch_size), "--resp", str(args.max_new_tokens), "--threads",
                       str(args.threads)], args.timeout)
            if t is not None:
                out["trl"].append(t)
                print(f"\nTRL 0.11.4 {'PPOTrainer' if method == 'ppo' else 'official CORY recipe'}"
                      f" (full float32): {t['s_per_iter']:.2f} s/iteration, peak RSS "
                      f"{t['peak_rss_mb']} MB")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
