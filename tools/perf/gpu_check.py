"""The paper's GPU settings in one short, offline check: `make gpu-check` (docs/performance.md).

    python tools/perf/gpu_check.py                      # on a CUDA machine, <= 5 minutes
    python tools/perf/gpu_check.py --dry-run            # tiny shapes on a CPU, about a minute

Builds random-init models of the paper's shapes locally (no hub): GPT-2-Large (774M) for
IMDB and a 1.1B Llama loaded in 4-bit nf4 with LoRA for GSM8K, each with the offline task's
tokenizer padded with placeholder tokens to the model's vocabulary. Then runs a few
iterations of PPO and CORY per shape in its own child process (so peak memory is per job),
with and without `torch_compile`; one FSDP iteration and checkpoint on a tiny model (the
full-state gather of sharded weights on the device); and the suite's CUDA-only tests
(`pytest -m gpu`).

Per job and phase it records seconds (median over the iterations after the first), generated
tokens/s, peak GPU memory, and the update's model FLOP utilisation (MFU) against the device's
dense bf16 peak. FLOPs are counted per token of every sequence the update passes through a
model: forward 2*N + 4*L*d*s (N = matmul parameters including the LM head, L layers, width
d, s = sequence length: the attention scores and mixing), times 3 with full fine-tuning
(forward + both backward matmuls) or times 2 with LoRA on a frozen base (no weight
gradients for the base); old log-prob recompute passes count one forward. The whole check
has a hard time limit (`--time-limit`); a job that would start past it is recorded as skipped.
Output: `gpu_check.json` and `gpu_check.md` in `--out`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # `python tools/perf/gpu_check.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROOT = Path(__file__).resolve().parents[2]
# Dense bf16 tensor-core peaks (vendor spec sheets), by a name fragment of the device.
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "A6000": 154.8,
                    "L40S": 362.0, "A10": 125.0, "V100": 125.0}


@dataclass(frozen=True)
class Shape:
    """One model shape and the PPO setting it is trained with."""

    name: str
    task: str
    arch: str  # "gpt2" | "llama"
    dims: dict  # config keywords
    batch_size: int
    mini_batch_size: int
    grad_accum_steps: int
    max_new_tokens: int
    lora: bool = False
    load_in_4bit: bool = False
    extra: dict = field(default_factory=dict)  # PPOConfig keywords


def shapes(dry: bool) -> list[Shape]:
    """The paper's IMDB and GSM8K shapes, or tiny ones of the same structure for --dry-run."""
    if dry:
        gpt2 = dict(n_layer=2, n_embd=64, n_head=2, vocab_size=2048, n_positions=256)
        llama = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                     max_position_embeddings=512)
        return [Shape("imdb", "sentiment", "gpt2", gpt2, 8, 4, 2, 8),
                Shape("gsm8k", "arithmetic", "llama", llama, 4, 2, 2, 8, lora=True)]
    gpt2 = dict(n_layer=36, n_embd=1280, n_head=20, vocab_size=50257, n_positions=1024)
    llama = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                 num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                 max_position_embeddings=2048)
    return [Shape("imdb", "sentiment", "gpt2", gpt2, 256, 64, 4, 16),  # 256 = 64 x 4 accum
            Shape("gsm8k", "arithmetic", "llama", llama, 32, 2, 16, 128, lora=True,
                  load_in_4bit=True)]


# ----------------------------------------------------------------------------- models

def build_model(shape: Shape, folder: Path) -> Path:
    """Save a random-init model of `shape` with its task's tokenizer padded to its vocabulary."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()

    from cory_env.data.tokenizer import task_tokenizer

    out = folder / shape.name
    if (out / "config.json").exists():
        return out
    tok = copy.deepcopy(task_tokenizer(shape.task))  # the cached one is shared: pad a copy
    vocab = shape.dims["vocab_size"]
    if len(tok) > vocab:
        raise ValueError(f"{shape.name}: tokenizer has {len(tok)} tokens, model {vocab}")
    tok.add_tokens([f"<pad{i}>" for i in range(vocab - len(tok))])  # random models emit them
    ids = dict(eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # fast init on a GPU
        model = GPT2LMHeadModel(GPT2Config(**shape.dims, **ids)) if shape.arch == "gpt2" \
            else LlamaForCausalLM(LlamaConfig(**shape.dims, **ids))
    tmp = out.with_name(out.name + ".tmp")
    model.to(torch.bfloat16 if shape.load_in_4bit else torch.float32).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out


def flop_dims(model_dir: Path) -> tuple[int, int, int]:
    """(matmul parameters incl. the LM head, layers, width) of a saved model."""
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg["model_type"] == "gpt2":
        L, d, V = cfg["n_layer"], cfg["n_embd"], cfg["vocab_size"]
        return L * 12 * d * d + V * d, L, d  # attn 4d^2 + MLP 8d^2 per layer, head V*d
    L, d, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
    kv = d * cfg["num_key_value_heads"] // cfg["num_attention_heads"]
    return L * (2 * d * d + 2 * d * kv + 3 * d * cfg["intermediate_size"]) + V * d, L, d


def forward_flops(tokens: int, seq: int, dims: tuple[int, int, int]) -> float:
    """Forward FLOPs of `tokens` tokens in sequences of length `seq`."""
    n, L, d = dims
    return tokens * (2 * n + 4 * L * d * seq)


# ----------------------------------------------------------------------------- one job

def job_config(shape: Shape, model: Path, method: str, device: str, compiled: bool):
    """The TrainConfig of one job: `workload.train_config` with the shape's settings."""
    from workload import train_config

    settings = {"device": device, "ppo.grad_accum_steps": shape.grad_accum_steps,
                "lora": shape.lora, "load_in_4bit": shape.load_in_4bit, "torch_compile": compiled,
                **{f"ppo.{k}": v for k, v in shape.extra.items()}}
    return train_config(str(model), method, task=shape.task, batch_size=shape.batch_size,
                        mini_batch_size=shape.mini_batch_size,
                        max_new_tokens=shape.max_new_tokens, settings=settings)


class PhaseClock:
    """Seconds and peak memory of the rollout, the reference passes and the update of a step."""

    def __init__(self, trainer, cuda: bool):
        import torch

        self.torch, self.cuda, self.rows, self.tokens = torch, cuda, [], 0
        self.ref_s, self.ref_peak, self.rollout_peak, self.tokens_passed = 0.0, 0, 0, 0
        for policy in {id(p): p for p in trainer.learner.policies.values()}.values():
            policy.reference_logits = self.timed_ref(policy.reference_logits)
        update = trainer.learner.update

        def timed_update(turns, iteration):
            self.sync()
            self.rollout_peak = self.peak(reset=True)
            self.tokens = int(sum(float(t.response_mask.sum()) for t in turns.values()))
            self.tokens_passed = sum(t.input_ids.numel() for t in turns.values())
            self.seq = max(t.input_ids.shape[1] for t in turns.values())
            t0 = time.perf_counter()
            out = update(turns, iteration)
            self.sync()
            self.update_s, self.update_peak = time.perf_counter() - t0, self.peak(reset=True)
            return out

        trainer.learner.update = timed_update

    def sync(self) -> None:
        """Wait for queued CUDA work."""
        if self.cuda:
            self.torch.cuda.synchronize()

    def peak(self, reset: bool = False) -> int:
        """Peak allocated CUDA memory in MiB since the last reset (0 on a CPU)."""
        if not self.cuda:
            return 0
        mib = self.torch.cuda.max_memory_allocated() // 2**20
        if reset:
            self.torch.cuda.reset_peak_memory_stats()
        return int(mib)

    def timed_ref(self, fn):
        """`fn` with its seconds and peak memory added to the reference-pass totals."""
        def timed(*args, **kwargs):
            self.sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.sync()
            self.ref_s += time.perf_counter() - t0
            self.ref_peak = max(self.ref_peak, self.peak())
            return out
        return timed


def run_job(args) -> dict:
    """Train `args.iterations` iterations of one (shape, method, compile) job; return figures."""
    import torch

    from agents.training.train import Trainer

    shape = next(s for s in shapes(args.dry_run) if s.name == args.shape)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    cfg = job_config(shape, Path(args.model), args.method, args.device, args.compile)
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    load_s = time.perf_counter() - t0
    clock, rows = PhaseClock(trainer, cuda), []
    for _ in range(args.iterations):
        clock.ref_s, clock.ref_peak = 0.0, 0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        m = trainer.step()
        first = m.get("llm_0", {})
        recompute = any(a.recomputes for a in trainer.learner.agents.values())
        passes = cfg.ppo.ppo_epochs * (2 if shape.lora else 3) + recompute
        flops = passes * forward_flops(clock.tokens_passed, clock.seq,
                                       flop_dims(Path(args.model)))
        rows.append({"rollout_s": m["time_rollout_s"] - clock.ref_s, "ref_s": clock.ref_s,
                     "update_s": clock.update_s, "step_s": m["time_rollout_s"] + clock.update_s,
                     "generated_tokens": clock.tokens,
                     "decode_tokens_per_s": clock.tokens / max(m["time_rollout_s"] - clock.ref_s,
                                                               1e-9),
                     "peak_mib": {"rollout": clock.rollout_peak, "ref": clock.ref_peak,
                                  "update": clock.update_peak},
                     "update_tflops": flops / 1e12, "loss": first.get("loss"),
                     "skipped_batches": first.get("skipped_batches")})
    timed = rows[1:] or rows  # the first iteration warms up (and compiles)
    out = {k: round(statistics.median(r[k] for r in timed), 4) for k in
           ("rollout_s", "ref_s", "update_s", "step_s", "decode_tokens_per_s", "update_tflops")}
    out["peak_mib"] = {k: max(r["peak_mib"][k] for r in rows) for k in rows[0]["peak_mib"]}
    out.update(load_s=round(load_s, 2), first_step_s=round(rows[0]["step_s"], 2),
               generated_tokens=rows[-1]["generated_tokens"], iterations=len(rows),
               losses=[r["loss"] for r in rows], skipped_batches=[r["skipped_batches"]
                                                                  for r in rows])
    peak = bf16_peak(args.peak_tflops)
    out["mfu"] = round(out["update_tflops"] / out["update_s"] / peak, 4) if peak else None
    return out


def bf16_peak(override: float | None) -> float | None:
    """The device's dense bf16 peak in TFLOP/s (None on a CPU or an unknown GPU)."""
    import torch

    if override:
        return override
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)


# ----------------------------------------------------------------------------- the check

def jobs(dry: bool, bnb: bool) -> list[dict]:
    """Every (shape, method, compile) job in the order they run, with why one is skipped."""
    out = []
    for compiled in (False, True):  # every eager job first: compiling is the slow part
        for shape in shapes(dry):
            for method in ("ppo", "cory"):
                why = None
                if compiled and dry:
                    why = "dry run: torch.compile is checked on CUDA only"
                elif compiled and shape.load_in_4bit:
                    why = "torch.compile is not combined with bitsandbytes 4-bit layers"
                elif shape.load_in_4bit and not bnb:
                    why = "bitsandbytes is not installed"
                out.append({"shape": shape.name, "method": method, "compile": compiled,
                            "skipped": why})
    return out


def run_child(cmd: list[str], timeout: float) -> tuple[dict | None, str]:
    """Run a child that prints one JSON line last; (its result or None, error text)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, f"stopped at the time limit ({timeout:.0f} s)"
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode == 0 and lines:
        return json.loads(lines[-1]), ""
    return None, (p.stderr or p.stdout).strip()[-2000:]


def run_fsdp_checkpoint(model: Path, out: Path, cuda: bool, deadline: float) -> dict:
    """One FSDP iteration + checkpoint through `python -m agents.distributed --fsdp` (one
    rank), then the checkpoint's tensors must be full (unsharded) CPU tensors."""
    import torch

    left = deadline - time.monotonic()
    if left < 20:
        return {"skipped": "time limit"}
    folder = out / "fsdp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "1", "-m", "agents.distributed", "--fsdp", "--task", "sentiment", "--model",
           str(model), "--iterations", "1", "--batch-size", "4", "--mini-batch-size", "2",
           "--ppo-epochs", "1", "--out", str(folder)] + ([] if cuda else ["--cpu"])
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=left, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"failed": "stopped at the time limit"}
    if p.returncode:
        return {"error": (p.stderr or p.stdout)[-2000:]}
    state = torch.load(folder / "checkpoint.pt", map_location="cpu", weights_only=False)
    tensors = [v for agent in state["policies"].values() for v in agent.values()]
    full = all(type(v) is torch.Tensor and v.device.type == "cpu" for v in tensors)
    return {"ok": full, "tensors": len(tensors), "wall_s": round(time.monotonic() - t0, 1)}


def run_tests(deadline: float) -> dict:
    """The suite's CUDA-only tests (`pytest -m gpu`): counts and the summary line."""
    left = deadline - time.monotonic()
    if left < 20:
        return {"skipped": "time limit"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
           "tests"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=left, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"failed": "stopped at the time limit"}
    summary = (p.stdout.strip().splitlines() or [""])[-1]
    return {"returncode": p.returncode, "summary": summary,
            "tail": p.stdout[-3000:] if p.returncode not in (0, 5) else ""}


def markdown(report: dict) -> str:
    """The report as a short markdown table."""
    head = (f"GPU check, {report['date']}, commit {report['commit']}, {report['device']}, "
            f"torch {report['torch']}{' (dry run)' if report['dry_run'] else ''}\n\n"
            "| shape | method | compile | step s | rollout s | ref s | update s | "
            "decode tok/s | peak GiB (roll/ref/upd) | MFU |\n|" + "---|" * 10 + "\n")
    rows = []
    for j in report["jobs"]:
        r = j.get("result")
        cells = [j["shape"], j["method"], "yes" if j["compile"] else "no"]
        if r is None:
            cells += [f"skipped: {j['skipped']}" if j.get("skipped") else
                      f"failed: {j.get('error', '')[:60]}"] + [""] * 6
        else:
            gib = "/".join(f"{r['peak_mib'][k] / 1024:.1f}" for k in ("rollout", "ref", "update")) \
                if report["device"] != "cpu" else "n/a"
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
            cells += [f"{r['step_s']:.2f}", f"{r['rollout_s']:.2f}", f"{r['ref_s']:.2f}",
                      f"{r['update_s']:.2f}", f"{r['decode_tokens_per_s']:.0f}", gib, mfu]
        rows.append("| " + " | ".join(cells) + " |")
    tests, fsdp = report["tests"], report["fsdp_checkpoint"]
    foot = (f"\nFSDP checkpoint (one rank, full tensors on the CPU): "
            f"{'ok' if fsdp.get('ok') else fsdp}\n"
            f"CUDA-only tests (`pytest -m gpu`): {tests.get('summary') or tests}\n")
    return head + "\n".join(rows) + "\n" + foot


def commit() -> str:
    """The checkout's commit (short), or "unknown"."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=ROOT, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def check(args) -> dict:
    """Build the models, run every job and the CUDA tests in the time limit; write the files."""
    import importlib.util

    import torch

    start = time.monotonic()
    deadline = start + args.time_limit
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        raise SystemExit("gpu_check: no CUDA device; use --dry-run for the CPU check")
    device = "cuda" if cuda else "cpu"
    out, models = Path(args.out), Path(args.out) / "models"
    out.mkdir(parents=True, exist_ok=True)
    models.mkdir(exist_ok=True)
    report = {"date": time.strftime("%Y-%m-%d"), "commit": commit(), "dry_run": args.dry_run,
              "device": torch.cuda.get_device_name() if cuda else "cpu",
              "torch": torch.__version__, "bf16_peak_tflops": bf16_peak(args.peak_tflops),
              "time_limit_s": args.time_limit, "iterations": args.iterations,
              "shapes": {s.name: {"model": s.arch, **s.dims, "batch_size": s.batch_size,
                                  "mini_batch_size": s.mini_batch_size,
                                  "grad_accum_steps": s.grad_accum_steps,
                                  "max_new_tokens": s.max_new_tokens, "lora": s.lora,
                                  "load_in_4bit": s.load_in_4bit}
                         for s in shapes(args.dry_run)}, "jobs": [],
              "fsdp_checkpoint": {"skipped": "not reached"}, "tests": {"skipped": "not reached"}}
    bnb = cuda and importlib.util.find_spec("bitsandbytes") is not None
    built = {}
    for job in jobs(args.dry_run, bnb):
        report["jobs"].append(job)
        left = deadline - time.monotonic() - (30 if args.tests else 0)
        if job["skipped"]:
            continue
        if left < 15:
            job["skipped"] = "time limit"
            continue
        if job["shape"] not in built:
            shape = next(s for s in shapes(args.dry_run) if s.name == job["shape"])
            built[job["shape"]] = build_model(shape, models)
        cmd = [sys.executable, __file__, "--child", "--shape", job["shape"], "--method",
               job["method"], "--model", str(built[job["shape"]]), "--device", device,
               "--iterations", str(args.iterations)] + ["--compile"] * job["compile"] + \
            ["--dry-run"] * args.dry_run + (["--peak-tflops", str(args.peak_tflops)]
                                            if args.peak_tflops else [])
        t0 = time.monotonic()
        job["result"], err = run_child(cmd, left)
        job["wall_s"] = round(time.monotonic() - t0, 1)
        if err:
            job["error"] = err
        print(f"gpu_check: {job['shape']} {job['method']} compile={job['compile']}: "
              f"{'ok' if job['result'] else 'failed'} in {job['wall_s']} s", flush=True)
        if err:
            print(err, flush=True)
        save(report, out, start)  # what ran so far survives a later failure
    tiny = build_model(shapes(dry=True)[0], models / "tiny")  # FSDP's gather, not its speed
    report["fsdp_checkpoint"] = run_fsdp_checkpoint(tiny, out, cuda, deadline - 30)
    save(report, out, start)
    report["tests"] = run_tests(deadline) if args.tests else {"skipped": "--no-tests"}
    save(report, out, start)
    print(markdown(report))
    return report


def save(report: dict, out: Path, start: float) -> None:
    """Write gpu_check.json and gpu_check.md as they stand."""
    from cory_common.files import atomic_write

    report["wall_s"] = round(time.monotonic() - start, 1)
    atomic_write(out / "gpu_check.json", json.dumps(report, indent=1) + "\n")
    atomic_write(out / "gpu_check.md", markdown(report))


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (`--child` runs one job; internal)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on a CPU")
    p.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu-check",
                   help="folder for gpu_check.json, gpu_check.md and the models")
    p.add_argument("--time-limit", type=float, default=300.0, help="seconds for everything")
    p.add_argument("--iterations", type=int, default=3, help="iterations per job (first warms)")
    p.add_argument("--no-tests", dest="tests", action="store_false",
                   help="skip the CUDA-only tests")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's dense bf16 peak (default: by device name)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("--shape", "--method", "--model", "--device"):
        p.add_argument(name, help=argparse.SUPPRESS)
    p.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.time_limit <= 0 or args.iterations < 1:
        p.error(f"--time-limit must be > 0 and --iterations >= 1 (got {args.time_limit}, "
                f"{args.iterations})")
    return args


def main(argv=None) -> None:
    """Run the check, or one job with --child."""
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_job(args)), flush=True)
        return
    report = check(args)
    failed = [j for j in report["jobs"] if j.get("error")]
    failed += [] if report["fsdp_checkpoint"].get("ok", True) else ["fsdp"]
    failed += ["fsdp"] if report["fsdp_checkpoint"].get("error") else []
    tests_failed = report["tests"].get("returncode") not in (None, 0, 5)  # 5: none collected
    sys.exit(1 if failed or tests_failed else 0)


if __name__ == "__main__":
    main()
