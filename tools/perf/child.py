"""One timing job in its own process, so its peak memory is its own: the child of perf.py.

    python tools/perf/child.py cory --model runs/perf-ref-model --iters 3 --threads 1 \\
        --set lora=True --set mixed_precision=bf16 --set ppo.old_logprobs=sampler
    python tools/perf/child.py --lora-team 4 --model runs/perf-ref-model

Prints one JSON line: the median seconds of `Trainer.step()` (rollout and update apart) and
this process' peak RSS; with `--lora-team K`, the memory of K LoRA adapters on one base.
`--set PATH=VALUE` sets any `TrainConfig` field as the training command line does.
`run_json` is how a parent runs a child and reads that line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import time

from workload import ROOT, context_len, train_config


def time_iterations(cfg, iters: int, warmup: int) -> dict:
    """Median seconds of Trainer.step() over `iters` after `warmup` iterations."""
    from agents.training.train import Trainer

    trainer = Trainer(cfg, env_options={"context_len": context_len(cfg.max_new_tokens)})
    times, rollout, update, warm = [], [], [], []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        m = trainer.step()
        if i < warmup:
            warm.append(time.perf_counter() - t0)
        else:
            times.append(time.perf_counter() - t0)
            rollout.append(m["time_rollout_s"])
            update.append(m["time_update_s"])
    dropped = int(trainer.env.episodes.dropped.max())
    return {"s_per_iter": round(statistics.median(times), 3), "all": [round(t, 2) for t in times],
            "rollout_s": round(statistics.median(rollout), 3),
            "update_s": round(statistics.median(update), 3), "truncated_prompt_tokens": dropped,
            "warmup_s": round(sum(warm), 1)}  # with torch.compile: the compiling included


def peak_rss_mb() -> int:
    """This process' peak resident memory in MB.

    VmHWM, not ru_maxrss: a spawned child's ru_maxrss starts at its parent's peak RSS (Linux
    carries it over at exec), which hid every child peak below the parent's (about 590 MB here).
    """
    peak = proc_status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def proc_status_mb(key: str) -> int | None:
    """A memory figure of /proc/self/status ("VmHWM", "VmRSS") in MB; None where unreadable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def last_json(text: str) -> dict | None:
    """The last line of text that parses as a JSON object."""
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def run_json(cmd: list[str], what: str, timeout: float) -> dict | None:
    """Run a command, return its last JSON line; print its error tail and return None on failure."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        print(f"  {what}: timed out after {timeout:.0f} s", flush=True)
        return None
    result = last_json(proc.stdout)
    if proc.returncode or result is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        print(f"  {what}: failed (exit {proc.returncode}):\n    " + "\n    ".join(tail))
        return None
    return result


def settings(items: list[str]) -> dict:
    """`--set PATH=VALUE` items as `train_config` settings ("ppo.lr=1e-4" -> {"ppo.lr": 0.0001})."""
    from cory_common.cli import literal

    out = {}
    for item in items:
        path, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set takes PATH=VALUE, got {item!r}")
        out[path.strip()] = literal(value.strip())
    return out


def time_method(args) -> dict:
    """Time one method: this process' figures as one dict."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = train_config(args.model, args.method, max_new_tokens=args.resp,
                       settings={"device": args.device, **settings(args.set)})
    out = time_iterations(cfg, args.iters, args.warmup)
    out.update(method=args.method, resp=args.resp, threads=args.threads, settings=args.set,
               peak_rss_mb=peak_rss_mb())
    if args.device.startswith("cuda"):
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() // 2**20
    return out


def lora_team(model: str, k: int) -> dict:
    """Build K LoRA policies on one base in this process; their memory."""
    from agents.llm.loading import LoraSettings
    from agents.llm.policy import LLMPolicy
    from cory_env import agent_names

    before = proc_status_mb("VmRSS")
    team = LLMPolicy.shared_lora(model, LoraSettings(), names=agent_names(k))
    params = {id(p): p for pol in team for p in pol.parameters()}
    lora = [p for n, p in team[0].model.named_parameters() if "lora_" in n]
    mb = lambda ps: round(sum(p.numel() * p.element_size() for p in ps) / 2**20, 2)  # noqa: E731
    return {"n_agents": k, "rss_growth_mb": proc_status_mb("VmRSS") - before,
            "param_mb": mb(params.values()), "adapters_mb": mb(lora),
            "value_heads_mb": mb([p for pol in team for p in pol.value_head.parameters()])}


def main(argv=None) -> None:
    """Run one job and print its JSON line."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("method", nargs="?", default="cory")
    p.add_argument("--model", default=str(ROOT / "runs" / "perf-ref-model"))
    p.add_argument("--resp", type=int, default=16, help="new tokens per answer")
    p.add_argument("--iters", type=int, default=6, help="timed iterations (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="a TrainConfig field, e.g. lora=True, ppo.max_tokens_per_pass=512")
    p.add_argument("--lora-team", type=int, default=None, metavar="K",
                   help="instead: the memory of K LoRA adapters on one base")
    args = p.parse_args(argv)
    out = lora_team(args.model, args.lora_team) if args.lora_team else time_method(args)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
