"""Benchmarks: train methods over tasks and seeds with one shared setting, then report.

    from benchmarks import resolve_config, run_benchmark
    cfg = resolve_config("quick")                   # or "offline", "imdb", "imdb-xl", "gsm8k"
    run_benchmark(cfg, "runs/smoke")                # metrics, TensorBoard, plots, report.md

A run folder holds (all written incrementally; a kill loses at most the iteration in progress):

    run_config.json   the resolved settings (``--resume`` refuses different ones)
    metrics.jsonl     one line per task/method/seed/eta/iteration/agent, numbers + samples
    metrics.csv       the same rows' common numeric columns (CSV_COLUMNS)
    eval.jsonl        pass@1 / pass@k / greedy accuracy on the test split (exact-match tasks)
    log.txt           one line per iteration and per event
    tb/<run key>/     TensorBoard scalars
    ckpt/<run key>.pt the latest full-state Trainer checkpoint; done/<run key> once finished
    plots/*.png       curves (mean ± std over seeds) and, with an η sweep, a Pareto plot
    report.md         the table, contribution audit, samples, evaluation and claim checks

`benchmarks/run.py` is the command line over this module; `benchmarks/report.py` makes the
numbers, claim checks, plots and report from the records alone.
"""

from __future__ import annotations

import csv
import dataclasses
import gc
import inspect
import io
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from agents.policy import LoraSettings, SamplingConfig
from agents.ppo import IMDB_PRESET, PPOConfig, gsm8k_preset
from agents.train import TrainConfig, Trainer, known_methods
from cory_env import BatchedCoryEnv, make_task, registered_tasks

from . import report

PAPER_ETAS = (1e-5, 1e-4, 1e-3, 1e-2)
EVAL_TASKS = ("arithmetic", "gsm8k")  # exact-match rewards: reward 1 = solved
FORMAT = 1
ID_COLUMNS = ("task", "method", "seed", "sweep_eta", "run", "iteration", "agent", "role",
              "swap_roles")
CSV_COLUMNS = ID_COLUMNS + (
    "task_reward", "task_reward_std", "kl", "combined_reward", "eta", "beta",
    "collective_reward", "copy_rate", "distinct_1", "distinct_2", "repetition_rate",
    "response_length", "value_loss", "policy_loss", "loss", "clipfrac", "value_clipfrac",
    "approx_kl", "entropy", "ratio_mean", "grad_norm", "kl_loss", "sampled_neg_logprob",
    "optimizer_steps", "epochs_run", "skipped_batches", "time_rollout_s", "time_update_s")
TIME_FIELDS = ("time_rollout_s", "time_update_s")


def _help(text: str, **kw) -> dict:
    """Field metadata holding the option's help text."""
    return {"help": text, **kw}


# ------------------------------------------------------------------------------- settings
@dataclass
class BenchConfig:
    """Every setting of a benchmark; one set shared by all methods (see `lr_by_method`).

    The defaults are the "offline" preset, sized to finish in about 10-15 minutes on 2 CPU
    cores with the offline reference LMs (4 layers, n_embd 128): 3 seeds x 2 tasks x {ppo,
    cory} x 20 iterations of batch 32. PPO settings are the paper's IMDB ones (4 epochs, one
    mini-batch per epoch, adaptive KL from 0.3 with target 6, full KL, clip 0.2, vf 0.1,
    gamma 1, lambda 0.95), except lr 1e-4 instead of 1.41e-5: 20 iterations of 32 episodes
    are ~40x fewer samples than the paper's 100 of 256. Nothing is tuned per method.
    """

    tasks: list[str] = field(default_factory=lambda: ["sentiment", "arithmetic"],
                             metadata=_help("comma list of tasks"))
    methods: list[str] = field(default_factory=lambda: ["ppo", "cory"],
                               metadata=_help("comma list of methods"))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2],
                             metadata=_help("comma list of seeds"))
    iterations: int = field(default=20, metadata=_help("training iterations per run"))
    batch_size: int = field(default=32, metadata=_help("episodes per iteration"))
    mini_batch_size: int = field(default=32, metadata=_help("PPO mini-batch size"))
    grad_accum_steps: int = field(default=1, metadata=_help("mini-batches per optimizer step"))
    ppo_epochs: int = field(default=4, metadata=_help("PPO epochs per iteration"))
    lr: float = field(default=1e-4, metadata=_help("learning rate (all methods)"))
    lr_by_method: dict[str, float] = field(
        default_factory=dict, metadata=_help("per-method lr, e.g. ppo=1e-5 (paper's GSM8K "
                                             "setting; an explicit --lr clears it)"))
    init_kl_coef: float = field(default=0.3, metadata=_help("initial KL coefficient beta"))
    adaptive_kl: bool = field(default=True, metadata=_help("adaptive KL controller"))
    kl_target: float = field(default=6.0, metadata=_help("adaptive KL target"))
    kl_penalty: str = field(default="full", metadata=_help("kl | abs | mse | full"))
    t_rex: int = field(default=5, metadata=_help("role-exchange period T_REx"))
    max_new_tokens: int | None = field(default=None,
                                       metadata=_help("tokens per answer (task default)"))
    repetition_penalty: float = field(default=1.0, metadata=_help("sampling repetition penalty"))
    model: str | None = field(default=None, metadata=_help(
        "HF name or folder ('{task}' is replaced by the task); default: the offline LM"))
    lora: bool = field(default=False, metadata=_help("train LoRA adapters"))
    load_in_4bit: bool = field(default=False, metadata=_help("4-bit base model (needs LoRA)"))
    task_options: dict[str, str] = field(default_factory=dict, metadata=_help(
        "task keywords k=v,..., given to the tasks that accept them"))
    eta_sweep: list[float] = field(default_factory=list, metadata=_help(
        "fixed KL coefficients to sweep (no value: the paper's 1e-5,1e-4,1e-3,1e-2)"))
    eval_problems: int = field(default=32, metadata=_help("test problems for pass@k (0: off)"))
    eval_samples: int = field(default=8, metadata=_help("samples per test problem"))
    pass_k: int = field(default=4, metadata=_help("k of pass@k"))
    eval_batch_size: int = field(default=64, metadata=_help("episodes per evaluation batch"))
    final_window: int = field(default=5, metadata=_help("last iterations averaged as 'final'"))
    checkpoint_every: int = field(default=1, metadata=_help("iterations between checkpoints"))
    device: str = field(default="cpu", metadata=_help("torch device"))
    threads: int = field(default=1, metadata=_help(
        "torch CPU threads (0: torch's default); fixed so numbers do not depend on the machine"))
    preset: str = field(default="offline", metadata=_help("named settings"))
    quick: bool = field(default=False, metadata=_help("a short smoke run"))

    def etas(self) -> list[float | None]:
        """The KL settings to run: the sweep's fixed coefficients, or [None] (the preset's)."""
        return list(self.eta_sweep) or [None]

    def model_for(self, task: str) -> str | None:
        """The model of a task ('{task}' in `model` is replaced by the task name)."""
        return self.model.replace("{task}", task) if self.model else None

    def lr_for(self, method: str) -> float:
        """The method's learning rate: `lr_by_method` if it names the method, else `lr`."""
        return float(self.lr_by_method.get(method, self.lr))

    def validate(self) -> BenchConfig:
        """Raise ValueError naming the first bad value; loads no model."""
        validate_config(self)
        return self


def _positive(name: str, value) -> None:
    """Raise ValueError unless value is a positive int."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def validate_config(cfg: BenchConfig) -> None:
    """Check every setting before any model loads, naming the bad value."""
    if cfg.preset not in PRESETS:
        raise ValueError(f"unknown preset {cfg.preset!r}; known: {sorted(PRESETS)}")
    for name, known in (("task", registered_tasks()), ("method", known_methods())):
        values = getattr(cfg, name + "s")
        if not values:
            raise ValueError(f"no {name}s given")
        for v in values:
            if v not in known:
                raise ValueError(f"unknown {name} {v!r}; known: {', '.join(known)}")
    if not cfg.seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in cfg.seeds):
        raise ValueError(f"seeds must be a non-empty list of integers, got {cfg.seeds!r}")
    for name in ("iterations", "batch_size", "mini_batch_size", "grad_accum_steps",
                 "ppo_epochs", "t_rex", "eval_samples", "pass_k", "eval_batch_size",
                 "final_window", "checkpoint_every"):
        _positive(name, getattr(cfg, name))
    step = cfg.mini_batch_size * cfg.grad_accum_steps
    if cfg.batch_size % step:
        raise ValueError(f"batch size {cfg.batch_size} is not divisible by mini-batch size "
                         f"{cfg.mini_batch_size} x grad accumulation {cfg.grad_accum_steps} "
                         f"= {step}")
    if cfg.max_new_tokens is not None:
        _positive("max_new_tokens", cfg.max_new_tokens)
    if isinstance(cfg.threads, bool) or not isinstance(cfg.threads, int) or cfg.threads < 0:
        raise ValueError(f"threads must be an integer >= 0, got {cfg.threads!r}")
    if isinstance(cfg.eval_problems, bool) or not isinstance(cfg.eval_problems, int) \
            or cfg.eval_problems < 0:
        raise ValueError(f"eval_problems must be an integer >= 0, got {cfg.eval_problems!r}")
    if cfg.pass_k > cfg.eval_samples:
        raise ValueError(f"pass_k {cfg.pass_k} exceeds eval_samples {cfg.eval_samples}")
    for eta in cfg.eta_sweep:
        if not (isinstance(eta, float) and eta > 0 and math.isfinite(eta)):
            raise ValueError(f"eta_sweep values must be positive numbers, got {eta!r}")
    for method, lr in cfg.lr_by_method.items():
        if method not in known_methods() or not lr > 0:
            raise ValueError(f"lr_by_method entry {method}={lr!r} needs a known method, lr > 0")
    _check_device(cfg.device)
    for task in cfg.tasks:
        model = cfg.model_for(task)
        if model and model.startswith(("/", ".", "~")) and not Path(model).expanduser().exists():
            raise ValueError(f"model folder {model!r} (task {task}) does not exist")
    _check_task_options(cfg)
    for spec in run_specs(cfg):
        train_config(cfg, spec).validate()


def _check_device(device: str) -> None:
    """A parseable torch device that this machine has (CUDA index included)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a torch device: {err}") from None
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if dev.type == "cuda" and (dev.index or 0) >= visible:
        raise ValueError(f"device {device!r} requested but {visible} CUDA device(s) are visible")


def _accepted_options(task: str) -> set[str]:
    """Keyword names a registered task's constructor accepts (builds a default task: cheap)."""
    try:
        params = inspect.signature(type(make_task(task))).parameters
    except (TypeError, ValueError):
        return set()
    return {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _check_task_options(cfg: BenchConfig) -> None:
    """Every task option must be accepted by at least one of the run's tasks."""
    accepted = set().union(*(_accepted_options(t) for t in cfg.tasks))
    for key in cfg.task_options:
        if key not in accepted:
            raise ValueError(f"task option {key!r} is accepted by none of the tasks "
                             f"{cfg.tasks}; they take {sorted(accepted)}")


def task_options(cfg: BenchConfig, task: str) -> dict:
    """The task options this task accepts (imdb's reward model follows --device by default)."""
    accepted = _accepted_options(task)
    options = {k: v for k, v in cfg.task_options.items() if k in accepted}
    if "reward_device" in accepted and "reward_device" not in options:
        options["reward_device"] = cfg.device
    return options


# ------------------------------------------------------------------------------- presets
def _imdb_preset(model: str, methods: list[str]) -> dict:
    """The paper's IMDB table (Table 1) on GPT-2 with the distilbert-imdb reward model."""
    p = IMDB_PRESET
    return dict(tasks=["imdb"], methods=methods, iterations=100, batch_size=p.batch_size,
                mini_batch_size=p.mini_batch_size, grad_accum_steps=p.grad_accum_steps,
                ppo_epochs=p.ppo_epochs, lr=p.lr, init_kl_coef=p.init_kl_coef,
                adaptive_kl=p.adap_kl_ctrl, kl_target=p.kl_target, kl_penalty=p.kl_penalty,
                max_new_tokens=16, repetition_penalty=1.1, model=model, device="cuda",
                task_options={"reward_model": "lvwerra/distilbert-imdb"}, eval_problems=0,
                threads=0, checkpoint_every=10)  # a GPT-2-Large pair + Adam: ~19 GB a save


def _gsm8k_preset() -> dict:
    """The paper's GSM8K table (Table 2): Llama-2-7b-chat, 4-bit + LoRA, per-method lr."""
    cory, ppo = gsm8k_preset("cory"), gsm8k_preset("ppo")
    return dict(tasks=["gsm8k"], methods=["ppo", "cory"], iterations=100,
                batch_size=cory.batch_size, mini_batch_size=cory.mini_batch_size,
                grad_accum_steps=cory.grad_accum_steps, ppo_epochs=cory.ppo_epochs,
                lr=cory.lr, lr_by_method={"ppo": ppo.lr}, init_kl_coef=cory.init_kl_coef,
                adaptive_kl=cory.adap_kl_ctrl, kl_penalty=cory.kl_penalty,
                model="meta-llama/Llama-2-7b-chat-hf", lora=True, load_in_4bit=True,
                device="cuda", threads=0, eval_problems=1319, eval_samples=8, pass_k=4,
                eval_batch_size=32)


# name -> overrides of the BenchConfig defaults (the "offline" preset is the defaults).
PRESETS: dict[str, dict] = {
    "offline": {},
    "quick": {"quick": True},
    "imdb": _imdb_preset("gpt2-large", ["ppo", "cory"]),
    "imdb-xl": _imdb_preset("gpt2-xl", ["ppo"]),  # the paper's size ablation for single PPO
    "gsm8k": _gsm8k_preset(),
}


def quick_settings(cfg: BenchConfig) -> BenchConfig:
    """Shrink any preset to a smoke run: one seed, 3 iterations, batch 8, 12-token answers."""
    mini = math.gcd(cfg.mini_batch_size, 8)
    return dataclasses.replace(
        cfg, quick=True, seeds=cfg.seeds[:1], iterations=3, batch_size=8, mini_batch_size=mini,
        grad_accum_steps=1, ppo_epochs=1, final_window=2, checkpoint_every=1,
        eval_problems=min(cfg.eval_problems, 4), eval_samples=4, pass_k=2, eval_batch_size=16,
        max_new_tokens=min(cfg.max_new_tokens or 12, 12))


def resolve_config(preset: str = "offline", quick: bool = False, **overrides) -> BenchConfig:
    """Preset, then the --quick shrink, then explicit settings; validated, no model loaded."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {sorted(PRESETS)}")
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(BenchConfig)})
    if unknown:
        raise ValueError(f"unknown settings {unknown}")
    cfg = dataclasses.replace(BenchConfig(), preset=preset, **PRESETS[preset])
    if quick or cfg.quick:
        cfg = quick_settings(cfg)
    cfg = dataclasses.replace(cfg, **overrides)
    if "lr" in overrides and "lr_by_method" not in overrides:
        cfg.lr_by_method = {}
    return cfg.validate()


# ------------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class RunSpec:
    """One training run: the key (task, method, seed, eta) of its files and checkpoint."""

    task: str
    method: str
    seed: int
    eta: float | None = None

    @property
    def key(self) -> str:
        """A file-name-safe identifier, e.g. arithmetic-cory-seed0 or ...-eta0.001."""
        tail = "" if self.eta is None else f"-eta{self.eta:g}"
        return f"{self.task}-{self.method}-seed{self.seed}{tail}"

    def ids(self) -> dict:
        """The identifying fields of every record of this run."""
        return {"task": self.task, "method": self.method, "seed": self.seed,
                "sweep_eta": self.eta, "run": self.key}


def run_specs(cfg: BenchConfig) -> list[RunSpec]:
    """All runs, ordered so that every seed finishes all methods before the next seed."""
    return [RunSpec(t, m, s, e) for t in cfg.tasks for e in cfg.etas() for s in cfg.seeds
            for m in cfg.methods]


def train_config(cfg: BenchConfig, spec: RunSpec) -> TrainConfig:
    """The TrainConfig of one run; a swept eta fixes the KL coefficient (no adaptation)."""
    eta = spec.eta
    ppo = PPOConfig(lr=cfg.lr_for(spec.method), ppo_epochs=cfg.ppo_epochs,
                    batch_size=cfg.batch_size, mini_batch_size=cfg.mini_batch_size,
                    grad_accum_steps=cfg.grad_accum_steps,
                    init_kl_coef=cfg.init_kl_coef if eta is None else eta,
                    adap_kl_ctrl=cfg.adaptive_kl and eta is None, kl_target=cfg.kl_target,
                    kl_penalty=cfg.kl_penalty)
    fixed_eta = eta if eta is not None else (None if cfg.adaptive_kl else cfg.init_kl_coef)
    return TrainConfig(task=spec.task, method=spec.method, model=cfg.model_for(spec.task),
                       iterations=cfg.iterations, batch_size=cfg.batch_size,
                       max_new_tokens=cfg.max_new_tokens, seed=spec.seed, device=cfg.device,
                       t_rex=cfg.t_rex, eta=fixed_eta, lora=LoraSettings() if cfg.lora else None,
                       load_in_4bit=cfg.load_in_4bit, task_options=task_options(cfg, spec.task),
                       ppo=ppo, sampling=SamplingConfig(
                           repetition_penalty=cfg.repetition_penalty))


# ------------------------------------------------------------------------------- records
def flatten(metrics: dict, spec: RunSpec) -> list[dict]:
    """A Trainer step's metrics as one flat record per agent."""
    out = []
    common = {"iteration": metrics["iteration"], "swap_roles": metrics["swap_roles"],
              **{k: metrics[k] for k in TIME_FIELDS if k in metrics}}
    for agent in sorted(k for k in metrics if k.startswith("llm_")):
        values = {k: v for k, v in metrics[agent].items()
                  if isinstance(v, (int, float, str, list)) or v is None}
        out.append({**spec.ids(), "agent": agent, **common, **values})
    return out


def numeric(record: dict) -> dict[str, float]:
    """The record's numeric metrics (for TensorBoard)."""
    skip = set(ID_COLUMNS) | {"samples"}
    return {k: float(v) for k, v in record.items() if k not in skip
            and isinstance(v, (int, float)) and not isinstance(v, bool)}


def audit_copy_rate(learner) -> None:
    """Make the learner's metrics add the observer's verbatim copy rate (all episodes)."""
    original = learner.metrics

    def metrics(turns, stats):
        out = original(turns, stats)
        by_role = {t.role: t for t in turns.values()}
        if {"pioneer", "observer"} <= set(by_role):
            rate = report.copy_rate(by_role["pioneer"].texts, by_role["observer"].texts)
            out[by_role["observer"].agent]["copy_rate"] = rate
        return out

    learner.metrics = metrics


class RunFolder:
    """The files of a benchmark run folder (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.metrics = self.path / "metrics.jsonl"
        self.csv = self.path / "metrics.csv"
        self.evals = self.path / "eval.jsonl"
        self.config = self.path / "run_config.json"

    def ckpt(self, spec: RunSpec) -> Path:
        """The run's checkpoint file."""
        return self.path / "ckpt" / f"{spec.key}.pt"

    def done_marker(self, spec: RunSpec) -> Path:
        """The file that marks a finished (trained and evaluated) run."""
        return self.path / "done" / spec.key

    def start(self, cfg: BenchConfig) -> None:
        """A new run folder: refuse to reuse one, write run_config.json."""
        if self.config.exists():
            raise ValueError(f"run folder {self.path} already holds a run; pass --resume to "
                             "continue it or choose another --out")
        self.path.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.config, json.dumps({"format": FORMAT, **dataclasses.asdict(cfg)},
                                              indent=2))

    def saved_config(self) -> BenchConfig:
        """The settings the folder's run was started with."""
        if not self.config.exists():
            raise ValueError(f"--resume: {self.config} not found; nothing to resume")
        saved = json.loads(self.config.read_text())
        saved.pop("format", None)
        unknown = sorted(set(saved) - {f.name for f in dataclasses.fields(BenchConfig)})
        if unknown:
            raise ValueError(f"--resume: {self.config} has settings this version does not "
                             f"know: {unknown}")
        return BenchConfig(**saved)

    def log(self, message: str) -> None:
        """Append a timestamped line to log.txt."""
        with open(self.path / "log.txt", "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")

    def append(self, records: list[dict]) -> None:
        """Append metric records to the JSONL and the CSV, flushed to disk."""
        _append_jsonl(self.metrics, records)
        new = not self.csv.exists()
        with open(self.csv, "a", newline="", encoding="utf-8") as f:
            if new:
                f.write(_csv_text([]))
            f.write(_csv_text(records, header=False))
            _sync(f)

    def truncate(self, spec: RunSpec, iteration: int) -> int:
        """Drop the run's records from `iteration` on and any torn line; make the CSV match."""
        lines = self.metrics.read_text(encoding="utf-8").splitlines() \
            if self.metrics.exists() else []
        keep = [r for r in report.read_jsonl(self.metrics)
                if not (r.get("run") == spec.key and r.get("iteration", 0) >= iteration)]
        if len(keep) != len(lines):
            _atomic_write(self.metrics, "".join(json.dumps(r) + "\n" for r in keep))
        text = _csv_text(keep)
        if not self.csv.exists() or self.csv.read_text(encoding="utf-8") != text:
            _atomic_write(self.csv, text)
        return len(lines) - len(keep)

    def has_eval(self, run: str) -> bool:
        """Whether eval.jsonl holds a record of the given run key."""
        return any(r.get("run") == run for r in report.read_jsonl(self.evals))

    def drop_evals(self, run: str) -> None:
        """Remove a run's evaluation records (before evaluating it again)."""
        rows = report.read_jsonl(self.evals)
        keep = [r for r in rows if r.get("run") != run]
        if len(keep) != len(rows):
            _atomic_write(self.evals, "".join(json.dumps(r) + "\n" for r in keep))

    def add_evals(self, records: list[dict]) -> None:
        """Append evaluation records."""
        _append_jsonl(self.evals, records)


def _sync(f) -> None:
    """Flush a file to disk."""
    f.flush()
    os.fsync(f.fileno())


def _append_jsonl(path: Path, records: list[dict]) -> None:
    """Append records as JSON lines (after a newline if a killed write left a torn line)."""
    torn = False
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(("\n" if torn else "") + "".join(json.dumps(r) + "\n" for r in records))
        _sync(f)


def _csv_text(records: list[dict], header: bool = True) -> str:
    """CSV_COLUMNS of the records as CSV text (with the header line unless told not to)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows(records)
    return buffer.getvalue()


def _atomic_write(path: Path, text: str) -> None:
    """Write a text file whole or not at all (temp file + rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        _sync(f)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------- evaluation
@torch.inference_mode()
def sample_rewards(env: BatchedCoryEnv, policy, sampling: SamplingConfig,
                   generator: torch.Generator, queries: list[int]) -> np.ndarray:
    """One answer per query index from a policy alone (single-agent env); their task rewards."""
    obs = env.reset(options={"queries": list(queries)})
    device, P = policy.device, env.prompt_len
    ids, mask = obs["input_ids"].to(device), obs["attention_mask"].to(device)
    state = policy.begin(ids[:, :P], mask[:, :P], sampling)
    while True:
        active = obs["active"].to(device)
        step = policy.sample(state, generator)
        obs, _, _, _, infos = env.step(step.token)
        if env.finished:
            return infos[env.agents[0]]["task_reward"].numpy()
        policy.feed(state, step.token, active)


def evaluate_policy(policy, trainer: Trainer, cfg: BenchConfig, seed: int) -> dict:
    """pass@1, pass@k (n samples per problem) and greedy accuracy on the test split."""
    env = BatchedCoryEnv(batch_size=cfg.eval_batch_size, task=trainer.env.task,
                         tokenizer=trainer.env.tokenizer, max_new_tokens=trainer.env.max_new_tokens,
                         split="test", single_agent=True, seed=seed)
    problems = list(range(min(cfg.eval_problems, len(env.task.queries("test")))))
    n, k = cfg.eval_samples, cfg.pass_k
    generator = torch.Generator(device=policy.device).manual_seed(seed)
    sampled = _rewards(env, policy, trainer.cfg.sampling, generator,
                       [p for p in problems for _ in range(n)], cfg.eval_batch_size)
    greedy_cfg = dataclasses.replace(trainer.cfg.sampling, top_k=1)
    greedy = _rewards(env, policy, greedy_cfg, generator, problems, cfg.eval_batch_size)
    correct = (sampled.reshape(len(problems), n) > 0.5).sum(1)
    return {"n_problems": len(problems), "n_samples": n, "k": k,
            "pass@1": float(np.mean([report.pass_at_k(n, int(c), 1) for c in correct])),
            "pass@k": float(np.mean([report.pass_at_k(n, int(c), k) for c in correct])),
            "greedy": float(np.mean(greedy > 0.5))}


def _rewards(env, policy, sampling, generator, queries: list[int], chunk: int) -> np.ndarray:
    """sample_rewards over any number of queries, `chunk` episodes at a time."""
    parts = [sample_rewards(env, policy, sampling, generator, queries[i:i + chunk])
             for i in range(0, len(queries), chunk)]
    return np.concatenate(parts) if parts else np.zeros(0)


def evaluate_models(trainer: Trainer, cfg: BenchConfig, spec: RunSpec,
                    base: bool = False) -> list[dict]:
    """Evaluation records of every model of a trainer (or its untrained llm_0 as "base")."""
    policies = trainer.learner.policies
    chosen = {"base": policies["llm_0"]} if base else dict(sorted(policies.items()))
    ids = {**spec.ids(), "method": "base", "sweep_eta": None, "run": f"{spec.task}-base"} \
        if base else spec.ids()
    out = []
    with torch.random.fork_rng(devices=[]):  # evaluation never touches training randomness
        for name, policy in chosen.items():
            out.append({**ids, "model": name, **evaluate_policy(policy, trainer, cfg,
                                                                spec.seed)})
    return out


def try_evaluate(trainer: Trainer, cfg: BenchConfig, spec: RunSpec, folder: RunFolder,
                 base: bool = False) -> list[dict]:
    """evaluate_models, logging and skipping it when the test split can't be loaded (hub)."""
    try:
        records = evaluate_models(trainer, cfg, spec, base)
    except OSError as err:  # e.g. the GSM8K test split without hub access
        folder.log(f"{spec.key}: evaluation skipped, test split unavailable: {err}")
        return []
    folder.log(f"{records[0]['run']}: evaluated " + ", ".join(
        f"{r['model']} pass@1 {r['pass@1']:.3f} pass@{r['k']} {r['pass@k']:.3f}"
        for r in records))
    return records


def wants_eval(cfg: BenchConfig, task: str) -> bool:
    """Whether a task gets the test-split pass@k evaluation."""
    return cfg.eval_problems > 0 and task in EVAL_TASKS


# ------------------------------------------------------------------------------- progress
class Progress:
    """A one-line progress bar with an ETA on stderr (plain lines when not a terminal)."""

    def __init__(self, total: int, stream=None, enabled: bool = True):
        self.total, self.done, self.stream = max(total, 1), 0, stream or sys.stderr
        self.enabled, self.start, self.counted, self.last_line = enabled, time.time(), 0, 0.0

    def skip(self, n: int) -> None:
        """Count units finished before this process started (no ETA credit)."""
        self.done += n

    def update(self, n: int = 1, note: str = "") -> None:
        """Count n finished units and redraw."""
        self.done += n
        self.counted += n
        if not self.enabled:
            return
        elapsed = time.time() - self.start
        eta = elapsed / self.counted * (self.total - self.done) if self.counted else 0.0
        width = 24
        fill = int(width * self.done / self.total)
        line = (f"[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} "
                f"{_clock(elapsed)} elapsed, ETA {_clock(eta)}  {note}")
        tty = getattr(self.stream, "isatty", lambda: False)()
        if tty:
            self.stream.write("\r" + line[:150].ljust(150))
        elif time.time() - self.last_line > 5 or self.done == self.total:
            self.stream.write(line + "\n")
            self.last_line = time.time()
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line."""
        if self.enabled and getattr(self.stream, "isatty", lambda: False)():
            self.stream.write("\n")


def _clock(seconds: float) -> str:
    """Seconds as 3m05s or 1h02m."""
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s"


# ------------------------------------------------------------------------------- driver
def run_one(cfg: BenchConfig, spec: RunSpec, folder: RunFolder, bar: Progress,
            stop_after: int | None = None) -> bool:
    """Train (or continue) one run, log every iteration, evaluate; True once finished."""
    from torch.utils.tensorboard import SummaryWriter

    trainer = Trainer(train_config(cfg, spec))
    audit_copy_rate(trainer.learner)
    base_key = f"{spec.task}-base"
    if wants_eval(cfg, spec.task) and not folder.has_eval(base_key):
        folder.add_evals(try_evaluate(trainer, cfg, spec, folder, base=True))
    if folder.ckpt(spec).exists():
        trainer.load(str(folder.ckpt(spec)))
        folder.log(f"{spec.key}: resumed from iteration {trainer.iteration}")
    dropped = folder.truncate(spec, trainer.iteration)
    if dropped:
        folder.log(f"{spec.key}: dropped {dropped} records written after the checkpoint")
    bar.skip(trainer.iteration)
    tb = folder.path / "tb" / spec.key  # on resume, TensorBoard drops steps >= purge_step
    writer = SummaryWriter(str(tb), purge_step=trainer.iteration if tb.exists() else None)
    try:
        while trainer.iteration < cfg.iterations:
            if stop_after is not None and trainer.iteration >= stop_after:
                return False
            records = flatten(trainer.step(), spec)
            folder.append(records)
            for r in records:
                for name, value in numeric(r).items():
                    writer.add_scalar(f"{r['agent']}/{name}", value, r["iteration"])
            writer.flush()
            if trainer.iteration % cfg.checkpoint_every == 0 \
                    or trainer.iteration == cfg.iterations:
                trainer.save(str(folder.ckpt(spec)))
            folder.log(_iteration_line(spec, records))
            bar.update(1, f"{spec.key} it {trainer.iteration - 1}")
    finally:
        writer.close()
    if wants_eval(cfg, spec.task):
        folder.drop_evals(spec.key)
        folder.add_evals(try_evaluate(trainer, cfg, spec, folder))
    folder.done_marker(spec).parent.mkdir(parents=True, exist_ok=True)
    folder.done_marker(spec).touch()
    folder.log(f"{spec.key}: finished")
    del trainer
    gc.collect()
    return True


def _iteration_line(spec: RunSpec, records: list[dict]) -> str:
    """The log line of one iteration."""
    parts = [f"{r['agent']}({r['role'][0]}) reward {r['task_reward']:.4g} kl {r['kl']:.4g}"
             for r in records]
    times = sum(records[0].get(k, 0.0) for k in TIME_FIELDS)
    return f"{spec.key} it {records[0]['iteration']}: " + ", ".join(parts) + f" [{times:.1f}s]"


def run_benchmark(cfg: BenchConfig, out: str | os.PathLike, resume: bool = False,
                  progress: bool = True, stop_after: int | None = None) -> Path:
    """Run (or resume) every run of cfg in folder `out`, then write plots and report.md.

    `stop_after` (testing): stop every run after that many iterations, as a kill would.
    """
    threads = torch.get_num_threads()
    try:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        return _run_all(cfg, RunFolder(out), resume, progress, stop_after)
    finally:
        torch.set_num_threads(threads)


def _run_all(cfg: BenchConfig, folder: RunFolder, resume: bool, progress: bool,
             stop_after: int | None) -> Path:
    """run_benchmark's body: runs not yet done, then the report."""
    if resume:
        check_resume(cfg, folder.saved_config())
    else:
        folder.start(cfg)
    specs = run_specs(cfg)
    bar = Progress(len(specs) * cfg.iterations, enabled=progress)
    folder.log(f"{'resuming' if resume else 'starting'} {len(specs)} runs")
    finished = True
    for spec in specs:
        if folder.done_marker(spec).exists():
            bar.skip(cfg.iterations)
            continue
        finished &= run_one(cfg, spec, folder, bar, stop_after)
    bar.close()
    path = report.write_report(folder.path)
    folder.log(f"report written ({'complete' if finished else 'partial'})")
    return path


def check_resume(cfg: BenchConfig, saved: BenchConfig) -> None:
    """Refuse to resume with settings other than the saved ones, naming each mismatch."""
    now, before = dataclasses.asdict(cfg), dataclasses.asdict(saved)
    diff = [f"{k}: saved {before[k]!r}, given {now[k]!r}" for k in now if now[k] != before[k]]
    if diff:
        raise ValueError("--resume with different settings than the run folder's "
                         "run_config.json: " + "; ".join(diff))


__all__ = ["BenchConfig", "PRESETS", "PAPER_ETAS", "RunSpec", "RunFolder", "resolve_config",
           "run_benchmark", "run_specs", "train_config", "evaluate_policy", "quick_settings"]
