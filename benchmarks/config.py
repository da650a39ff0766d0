"""Benchmark settings: `BenchConfig`, the presets, validation, runs, and their CLI options.

    cfg = resolve_config("gsm8k", quick=True, device="cpu")   # preset, --quick, overrides
    for spec in run_specs(cfg):                                # task x eta x seed x method
        train_config(cfg, spec)                                # -> agents.train.TrainConfig

Every field of `BenchConfig` is a command-line option (`add_config_options`); validation
checks every value before any model loads.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from agents.policy import LoraSettings, SamplingConfig
from agents.ppo import IMDB_PRESET, PPOConfig, gsm8k_preset
from agents.train import TrainConfig, known_methods
from cory_env import make_task, registered_tasks

PAPER_ETAS = (1e-5, 1e-4, 1e-3, 1e-2)


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
    max_tokens_per_pass: int | None = field(default=None, metadata=_help(
        "cap on tokens (rows x unpadded width) in one training pass: long sequences take more, "
        "smaller passes (less memory); none: no cap"))
    old_logprobs: str = field(default="auto", metadata=_help(
        "old log-probs and values: auto (recompute under 4-bit or mixed precision) | sampler "
        "(the rollout's own) | recompute (always, as TRL)"))
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
    mixed_precision: str | None = field(default="auto", metadata=_help(
        "auto: bf16 autocast on CUDA only; bf16: also on the CPU; none: never"))
    torch_compile: bool = field(default=False, metadata=_help(
        "torch.compile the training passes (a one-time compile, then faster updates)"))
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


def _integer(name: str, value, low: int = 1) -> None:
    """Raise ValueError unless value is an int >= low (a positive one by default)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ValueError(f"{name} must be {kind}, got {value!r}")


def unknown_settings(names) -> list[str]:
    """The names, sorted, that are not BenchConfig fields."""
    return sorted(set(names) - {f.name for f in dataclasses.fields(BenchConfig)})


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
        _integer(name, getattr(cfg, name))
    step = cfg.mini_batch_size * cfg.grad_accum_steps
    if cfg.batch_size % step:
        raise ValueError(f"batch size {cfg.batch_size} is not divisible by mini-batch size "
                         f"{cfg.mini_batch_size} x grad accumulation {cfg.grad_accum_steps} "
                         f"= {step}")
    for name in ("max_new_tokens", "max_tokens_per_pass"):
        if getattr(cfg, name) is not None:
            _integer(name, getattr(cfg, name))
    _integer("threads", cfg.threads, low=0)
    _integer("eval_problems", cfg.eval_problems, low=0)
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
    unknown = unknown_settings(overrides)
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

    @property
    def base_key(self) -> str:
        """The run key of the task's untrained model's evaluation, e.g. arithmetic-base."""
        return f"{self.task}-base"


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
                    max_tokens_per_pass=cfg.max_tokens_per_pass, old_logprobs=cfg.old_logprobs,
                    init_kl_coef=cfg.init_kl_coef if eta is None else eta,
                    adap_kl_ctrl=cfg.adaptive_kl and eta is None, kl_target=cfg.kl_target,
                    kl_penalty=cfg.kl_penalty)
    fixed_eta = eta if eta is not None else (None if cfg.adaptive_kl else cfg.init_kl_coef)
    return TrainConfig(task=spec.task, method=spec.method, model=cfg.model_for(spec.task),
                       iterations=cfg.iterations, batch_size=cfg.batch_size,
                       max_new_tokens=cfg.max_new_tokens, seed=spec.seed, device=cfg.device,
                       t_rex=cfg.t_rex, eta=fixed_eta, lora=LoraSettings() if cfg.lora else None,
                       load_in_4bit=cfg.load_in_4bit, mixed_precision=cfg.mixed_precision,
                       torch_compile=cfg.torch_compile, task_options=task_options(cfg, spec.task),
                       ppo=ppo, sampling=SamplingConfig(
                           repetition_penalty=cfg.repetition_penalty))



def check_resume(cfg: BenchConfig, saved: BenchConfig) -> None:
    """Refuse to resume with settings other than the saved ones, naming each mismatch."""
    now, before = dataclasses.asdict(cfg), dataclasses.asdict(saved)
    diff = [f"{k}: saved {before[k]!r}, given {now[k]!r}" for k in now if now[k] != before[k]]
    if diff:
        raise ValueError("--resume with different settings than the run folder's "
                         "run_config.json: " + "; ".join(diff))


# ------------------------------------------------------------------------------- CLI options
def comma_list(text: str) -> list[str]:
    """'a,b' -> ['a', 'b'] (empty items dropped)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def int_list(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]."""
    try:
        return [int(x) for x in comma_list(text)]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected integers like 0,1,2, got {text!r}") from err


def float_list(text: str) -> list[float]:
    """'1e-3,1e-2' -> [0.001, 0.01]; 'paper' -> the paper's η values."""
    if text == "paper":
        return list(PAPER_ETAS)
    try:
        return [float(x) for x in comma_list(text)]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected numbers like 1e-3,1e-2, got {text!r}") \
            from err


def literal(text: str):
    """A Python literal if the text is one (3, 0.5, True, None), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def key_values(text: str) -> dict:
    """'a=1,b=x' -> {'a': 1, 'b': 'x'}."""
    out = {}
    for item in comma_list(text):
        if "=" not in item:
            raise argparse.ArgumentTypeError(f"expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = literal(value.strip())
    return out


def optional(kind):
    """A converter that maps 'none' to None."""
    return lambda text: None if text.lower() == "none" else kind(text)


CONVERTERS = {"int": int, "float": float, "str": str, "list[str]": comma_list,
              "list[int]": int_list, "list[float]": float_list, "dict[str, float]": key_values,
              "dict[str, str]": key_values, "int | None": optional(int),
              "str | None": optional(str), "float | None": optional(float)}



def add_config_options(parser: argparse.ArgumentParser) -> None:
    """An option per BenchConfig field, help text and offline default included."""
    defaults = BenchConfig()
    for f in dataclasses.fields(BenchConfig):
        flag, help_ = "--" + f.name.replace("_", "-"), f.metadata.get("help", "")
        help_ += f" (offline default: {getattr(defaults, f.name)!r})"
        if f.name == "quick":
            parser.add_argument(flag, action="store_true", help=help_)
        elif f.name == "preset":
            parser.add_argument(flag, choices=sorted(PRESETS), help=help_)
        elif f.name == "eta_sweep":
            parser.add_argument(flag, nargs="?", const="paper", type=float_list, help=help_)
        elif f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_)
        else:
            parser.add_argument(flag, type=CONVERTERS[f.type], help=help_)
