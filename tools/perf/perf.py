"""Speed and memory of cory on the reference workload, next to the TRL anchors.

    python tools/perf/perf.py --model /tmp/ref                # builds /tmp/ref if missing
    python tools/perf/perf.py --model /tmp/ref --trl-python .venv-trl/bin/python
    python tools/perf/perf.py --quick                         # a smoke run

The workload is `workload.py`'s. Every timed configuration (`CONFIGS`) runs in its own child
process (`child.py`), so the peak RSS of one is not inflated by another, as in the TRL anchor
(`trl_anchor.py --workload reference`), which runs in the same invocation when a TRL 0.11.4
python is given (`make perf-trl-venv` builds .venv-trl); ours and TRL's alternate, round by
round. Then the env's own cost (`env_speed.py`) and, on CUDA, `gpu_rates.py`. `--chain` and
`--gpu-only` run only those. The last line printed is one JSON object with the headline
figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from child import run_json
from env_speed import aec_steps_per_s, batched_env_overhead, chain_costs
from gpu_rates import gpu_report
from workload import ROOT

FAST = "fast (LoRA + bf16, sampler log-probs)"
COMPILED = "fast + torch.compile"
LEAN_TOKENS = 512  # --lean: PPOConfig.max_tokens_per_pass (the observer's 16 x 59 pass in two)
LEAN = f"lean (LoRA, <= {LEAN_TOKENS} tokens a pass)"


# ----------------------------------------------------------------------------- our iterations

def run_ours(args, method: str, resp: int = 16, iters: int | None = None,
             lora: bool = False, precision: str | None = None,
             max_tokens_per_pass: int | None = None, old_logprobs: str = "auto",
             torch_compile: bool = False) -> dict | None:
    """Time one of our methods in a child process (precision None: the --precision option)."""
    precision = precision or args.precision
    cmd = [sys.executable, str(Path(__file__).with_name("child.py")), method, "--model",
           args.model, "--resp", str(resp), "--iters", str(iters or args.iters), "--warmup",
           str(args.warmup), "--threads", str(args.threads), "--device", args.device,
           "--set", f"mixed_precision={precision}", "--set", f"ppo.old_logprobs={old_logprobs}"]
    for path, value in (("lora", lora), ("ppo.max_tokens_per_pass", max_tokens_per_pass),
                        ("torch_compile", torch_compile)):
        cmd += ["--set", f"{path}={value}"] if value else []
    result = run_json(cmd, f"ours {method} T={resp}", args.timeout)
    if result:
        setting = [name for name, on in (("LoRA", lora), (precision, precision != "auto"),
                                         (f"<= {max_tokens_per_pass} tokens a pass",
                                          max_tokens_per_pass),
                                         (f"{old_logprobs} log-probs", old_logprobs != "auto"),
                                         ("torch.compile", torch_compile))
                   if on]
        label = f" ({', '.join(setting)})" if setting else ""
        print(f"  ours {method}{label} T={resp}: {result['s_per_iter']} "
              f"s/iter (rollout {result['rollout_s']}, update {result['update_s']}), "
              f"peak RSS {result['peak_rss_mb']} MB, warm-up {result['warmup_s']} s", flush=True)
    return result


# ----------------------------------------------------------------------------- TRL anchor

def trl_model_dir(model: str) -> str:
    """The model folder, or a copy whose tokenizer_config names a class transformers 4 knows."""
    cfg_path = Path(model) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("tokenizer_class") in (None, "PreTrainedTokenizerFast", "GPT2TokenizerFast"):
        return model
    copy = Path(model).with_name(Path(model).name + "-tf4")
    if not copy.exists():
        import shutil

        shutil.copytree(model, copy)
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # same tokenizer.json, same ids
        (copy / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return str(copy)


def run_trl(args, mode: str) -> dict | None:
    """Run trl_anchor.py's reference workload with the TRL venv's python, at our threads."""
    cmd = [args.trl_python, str(Path(__file__).with_name("trl_anchor.py")),
           trl_model_dir(args.model), "--workload", "reference", "--mode", mode,
           "--iters", str(args.iters), "--threads", str(args.threads)]
    result = run_json(cmd, f"TRL {mode}", args.timeout)
    if result:
        print(f"  TRL 0.11.4 {mode}: {result['s_per_iter']} s/iter, peak RSS "
              f"{result['peak_rss_mb']} MB", flush=True)
    return result


# ----------------------------------------------------------------------------- main

def resolve_threads(value: str) -> int:
    """'auto' -> all cores on an idle machine, fewer when the 1-minute load says they are busy."""
    cores = os.cpu_count() or 1
    if value != "auto":
        return max(1, int(value))
    return max(1, min(cores, cores - round(os.getloadavg()[0])))


def ensure_model(path: str, trl_python: str | None) -> None:
    """Write the reference model with reference_model.py unless `path` already holds it."""
    if (Path(path) / "config.json").exists():
        return
    python = trl_python or sys.executable  # transformers 4 writes a tokenizer both can read
    subprocess.run([python, str(Path(__file__).with_name("reference_model.py")), path],
                   check=True, capture_output=True)


FAST_KW = {"lora": True, "precision": "bf16", "old_logprobs": "sampler"}
# The configurations timed: (run key, label, the option that adds it (None: always), method,
# run_ours keywords). The summary's keys, the printed table and the rounds all come from it.
CONFIGS = (
    ("ppo", "full fine-tuning, fp32", None, "ppo", {}),
    ("cory", "full fine-tuning, fp32", None, "cory", {}),
    ("cory_lora", "LoRA on one base", "lora", "cory", {"lora": True}),
    ("ppo_fast", FAST, "fast", "ppo", FAST_KW),
    ("cory_fast", FAST, "fast", "cory", FAST_KW),
    ("ppo_compiled", COMPILED, "compiled", "ppo", {**FAST_KW, "torch_compile": True}),
    ("cory_compiled", COMPILED, "compiled", "cory", {**FAST_KW, "torch_compile": True}),
    ("cory_lean", LEAN, "lean", "cory", {"lora": True, "max_tokens_per_pass": LEAN_TOKENS}),
)


def chosen(args) -> list[tuple]:
    """The CONFIGS rows that these options turn on."""
    return [c for c in CONFIGS if c[2] is None or getattr(args, c[2])]


def one_round(args) -> dict[str, dict | None]:
    """Every child once: our PPO then TRL's, our CORY then the recipe, then our other rows."""
    trl = (lambda mode: run_trl(args, mode)) if args.trl_python else (lambda mode: None)
    runs = {}
    for key, _, _, method, kw in chosen(args):
        runs[key] = run_ours(args, method, **kw)
        if key in ("ppo", "cory"):
            runs[f"trl_{key}"] = trl(key)
    return runs


def combine(results: list[dict | None]) -> dict | None:
    """One child's figures over the rounds: the medians, and the largest peak RSS."""
    done = [r for r in results if r]
    if not done:
        return None
    out = dict(done[-1])
    for key in ("s_per_iter", "rollout_s", "update_s", "warmup_s"):  # TRL's have the first only
        if all(key in r for r in done):
            out[key] = round(statistics.median(r[key] for r in done), 3)
    if all("peak_rss_mb" in r for r in done):
        out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in done)
    return out


def within_rounds(rounds: list[dict], a: str, b: str, key: str = "s_per_iter") -> list:
    """Child a's figure / child b's in each round (None where either child failed)."""
    return [ratio(figure(r[a], key), figure(r[b], key)) for r in rounds]


def round_ratio(rounds: list[dict], a: str, b: str, key: str = "s_per_iter"):
    """Median over rounds of child a's figure / child b's, each ratio taken within one round."""
    values = [v for v in within_rounds(rounds, a, b, key) if v]
    return round(statistics.median(values), 3) if values else None


def ratio(a, b):
    """a / b rounded, or None when either is missing."""
    return round(a / b, 3) if a is not None and b else None


def figure(result: dict | None, key: str = "s_per_iter"):
    """A field of a child's result, or None."""
    return None if result is None else result.get(key)


def print_table(rows: list[tuple[str, object, object]]) -> None:
    """A small markdown table: what, ours, anchor."""
    print("\n| figure | ours | TRL 0.11.4 (same run) |\n|---|---|---|")
    for name, ours, anchor in rows:
        print(f"| {name} | {ours} | {anchor} |")


def main(argv=None) -> None:
    """Run every measurement and print the summary JSON line last."""
    args = parse_args(argv)
    args.threads = resolve_threads(args.threads)
    if args.gpu_only:
        import torch

        report = gpu_report(args.model, args.iters) if torch.cuda.is_available() else None
        print(json.dumps({"gpu": report}))
        return None
    if args.trl_python and not Path(args.trl_python).exists():
        print(f"no TRL python at {args.trl_python}: TRL rows are null (make perf-trl-venv)")
        args.trl_python = None
    ensure_model(args.model, args.trl_python)
    if args.chain:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(chain_costs(args.model, args.chain_agents, args.env_rounds,
                                     args.timeout)))
        return None
    print(f"model {args.model}, threads {args.threads} (load {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} cores), {args.iters} timed iterations after {args.warmup}",
          flush=True)

    print("iterations (each in its own process; ours next to TRL's, so both see the same load):",
          flush=True)
    rounds = []
    for i in range(args.rounds):
        if args.rounds > 1:
            print(f"round {i + 1} of {args.rounds}:", flush=True)
        rounds.append(one_round(args))
    runs = {name: combine([r[name] for r in rounds]) for name in rounds[0]}
    by_round = functools.partial(round_ratio, rounds)

    t64 = None if args.skip_length else run_ours(args, "cory", 64, args.length_iters)

    # In this process, after the children: what it loads would otherwise add to their RSS.
    print("AEC env, random tokens, reward excluded:", flush=True)
    aec = {t: round(aec_steps_per_s(t, args.env_steps)) for t in ("sentiment", "arithmetic")}
    print(f"  steps/s {aec}", flush=True)
    import torch

    torch.set_num_threads(args.threads)
    overhead = batched_env_overhead(args.model, args.env_rounds)
    print(f"  batched env B=64: {overhead}", flush=True)
    gpu = gpu_report(args.model, args.iters) if torch.cuda.is_available() else None

    cory = runs["cory"]
    summary = {"trl_ppo_s_per_iter": figure(runs["trl_ppo"]),
               "trl_cory_s_per_iter": figure(runs["trl_cory"]),
               "trl_ppo_peak_rss_mb": figure(runs["trl_ppo"], "peak_rss_mb"),
               "trl_cory_peak_rss_mb": figure(runs["trl_cory"], "peak_rss_mb"),
               "env_overhead_frac": overhead["frac_of_step"],
               "env_overhead_frac_of_forward": overhead["frac_of_forward"],
               "t64_over_t16": ratio(figure(t64), figure(cory)), "aec_steps_per_s": aec,
               "threads": args.threads, "gpu": gpu, "rounds": args.rounds}
    rows = [("PPO s/iter", figure(runs["ppo"]), figure(runs["trl_ppo"])),
            ("CORY s/iter", figure(cory), figure(runs["trl_cory"])),
            ("CORY peak RSS MB", figure(cory, "peak_rss_mb"),
             figure(runs["trl_cory"], "peak_rss_mb"))]
    goals = {"ppo": "goal <= 0.4", "cory": "goal <= 0.25"}
    for key, label, _, method, _ in chosen(args):
        anchor = f"trl_{method}"
        summary.update({f"{key}_s_per_iter": figure(runs[key]),
                        f"{key}_peak_rss_mb": figure(runs[key], "peak_rss_mb"),
                        f"{key}_warmup_s": figure(runs[key], "warmup_s"),
                        f"{key}_over_{anchor}": by_round(key, anchor),
                        f"{key}_rss_over_{anchor}": by_round(key, anchor, "peak_rss_mb")})
        name = f"{label}: {'PPO / TRL PPO' if method == 'ppo' else 'CORY / recipe'}"
        rows.append((f"{name} ({goals[method]})", summary[f"{key}_over_{anchor}"], ""))
        if method == "cory":
            rows.append((f"{label}: CORY RSS / recipe RSS (goal <= 0.5)",
                         summary[f"{key}_rss_over_{anchor}"], ""))
    summary["cory_over_trl_cory_by_round"] = {
        key: within_rounds(rounds, key, "trl_cory") for key, *_, method, _ in chosen(args)
        if method == "cory" and runs[key]}
    rows += [("env step / decode step (goal <= 0.05)", overhead["frac_of_step"], ""),
             ("CORY time T=64 / T=16 (goal <= 4.5)", summary["t64_over_t16"], "")]
    print_table(rows)
    print(json.dumps(summary))


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "runs" / "perf-ref-model"),
                   help="reference model folder (written by reference_model.py if missing)")
    p.add_argument("--iters", type=int, default=6, help="timed iterations (median reported)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every child (ours and TRL's) this many times, interleaved; ratios "
                        "are medians of the ratios within a round (this machine drifts)")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    p.add_argument("--length-iters", type=int, default=3, help="timed iterations at T=64")
    p.add_argument("--skip-length", action="store_true", help="skip the T=64 run")
    p.add_argument("--threads", default="auto",
                   help="torch threads for us AND TRL; auto = cores minus the 1-min load")
    default_trl = ROOT / ".venv-trl" / "bin" / "python"
    p.add_argument("--trl-python", default=str(default_trl) if default_trl.exists() else None,
                   help="python of a TRL 0.11.4 venv (make perf-trl-venv); default .venv-trl")
    p.add_argument("--no-trl", dest="trl_python", action="store_const", const=None)
    p.add_argument("--lora", action="store_true",
                   help="also time CORY with LoRA adapters on one shared base")
    p.add_argument("--fast", action="store_true",
                   help="also time PPO and CORY with LoRA on one shared base + bf16 autocast, "
                        "old log-probs from the sampler (no recomputing pass)")
    p.add_argument("--compiled", action="store_true",
                   help="also time PPO and CORY in the --fast configuration with torch.compile'd "
                        "training passes (TrainConfig.torch_compile; compiled in the warm-up)")
    p.add_argument("--lean", action="store_true",
                   help=f"also time CORY with LoRA and at most {LEAN_TOKENS} tokens a training "
                        "pass (PPOConfig.max_tokens_per_pass)")
    p.add_argument("--env-steps", type=int, default=20000, help="AEC steps per timing")
    p.add_argument("--env-rounds", type=int, default=4, help="batched-env rollouts timed")
    p.add_argument("--chain", action="store_true",
                   help="only a K-agent chain's costs, for each --chain-agents: the batched "
                        "env step per decode step, and the memory of K LoRA adapters on one base")
    p.add_argument("--chain-agents", type=lambda s: [int(k) for k in s.split(",")],
                   default=[2, 4], help="chain lengths K of --chain (comma list)")
    p.add_argument("--device", default="cpu", help="device of our iterations")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16"],
                   help="auto: bf16 autocast on CUDA only; bf16: also on CPU (opt-in)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 iterations, fewer steps")
    p.add_argument("--gpu-only", action="store_true", help="only the CUDA measurements")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be a positive integer, got {args.rounds}")
    if args.quick:
        args.iters, args.length_iters, args.env_steps, args.env_rounds = 2, 1, 5000, 1
    return args


if __name__ == "__main__":
    main()
