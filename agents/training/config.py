"""A training run's settings: TrainConfig (the LearnerConfig plus the env, models, devices and
budget), checked before any model loads, and how command lines and saved runs become one.

    from agents.training.config import TrainConfig
    cfg = TrainConfig(task="sentiment", method="cory", model="path/to/lm").validate()
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from dataclasses import dataclass, field

import torch

from cory_common.checks import check_fields, check_int, meta
from cory_common.cli import add_import_option, add_options, apply, in_flags
from cory_common.files import check_local_path
from cory_common.plugins import load_plugins
from cory_common.pretrained import check_model
from cory_env import EnvConfig, make_task, registered_tasks, task_defaults
from cory_env.chain import agent_names

from ..learners.learner import LearnerConfig
from ..learners.ppo_config import PPOConfig
from ..learners.registry import registered_methods, registered_structures, resolve_method
from ..llm.engine import DECODE_PATHS
from ..llm.loading import LoraSettings, check_adapter_base, check_weights, model_positions
from ..llm.sampling import SamplingConfig
from ..llm.speed import check_mixed_precision

PPO_DEFAULTS = PPOConfig()


@dataclass
class TrainConfig(LearnerConfig):
    """One training run: task, method, model and every hyperparameter (the learner's own
    settings, `ppo`, `sampling`, `t_rex`, ..., are LearnerConfig's fields)."""

    task: str = field(default="sentiment", metadata=meta(
        "task name (cory_env.registered_tasks)", check=False))  # or a Task class / instance
    method: str = field(default="cory", metadata=meta(
        "method: a registered name (registered_methods) or learner/structure"))
    model: str | None = field(default=None, metadata=meta(
        "HF name or local folder; none: the offline task's reference LM"))
    n_agents: int | None = field(default=None, metadata=meta(
        "K agents in the chain (none: the method's default, 2; 1 for ppo)"))
    rounds: int = field(default=1, metadata=meta(
        "R rounds: the chain repeats R times, each agent answering once per round"))
    models: dict[str, str] = field(default_factory=dict, metadata=meta(
        "a model per agent, e.g. llm_1=path/to/other (one tokenizer for all; in Python also a "
        "list, entry i for llm_i)"))
    adapters: dict[str, str] = field(default_factory=dict, metadata=meta(
        "a PEFT LoRA adapter folder per agent on the one base model (or a list)"))
    iterations: int = field(default=20, metadata=meta("training iterations"))
    max_new_tokens: int | None = field(default=None, metadata=meta(
        "tokens per answer (none: the task's default)"))
    seed: int = field(default=0, metadata=meta("seed of models, sampling and data order"))
    device: str = field(default="cpu", metadata=meta("torch device"))
    lora: LoraSettings | None = field(default=None, metadata=meta("train LoRA adapters"))
    load_in_4bit: bool = field(default=False, metadata=meta("4-bit nf4 base (needs LoRA, CUDA)"))
    shared_base: bool = field(default=True, metadata=meta(
        "with LoRA: both agents are adapters on one frozen base"))
    mixed_precision: str | None = field(default="auto", metadata=meta(
        "auto: bf16 autocast on CUDA only; bf16: also on the CPU; none: never"))
    decode: str = field(default="auto", metadata=meta(
        "decode path of rollouts and evaluations: exact (the model's own modules) | fast "
        "(agents/llm/engine.py: Llama or Gemma 3 in bf16 on a CPU) | auto (fast where it runs)"))
    torch_compile: bool = field(default=False, metadata=meta(
        "torch.compile the training passes (compiled on first use)"))
    placement: dict[str, str] = field(default_factory=dict, metadata=meta(
        "device per model, e.g. llm_0=cuda:0,llm_1=cuda:1,critic=cuda:1"))
    task_options: dict = field(default_factory=dict, metadata=meta("task keywords k=v,..."))

    def validate(self) -> TrainConfig:
        """Check the config before any model is loaded, naming the bad field, and return the
        config a run uses: itself, or a copy with its derived fields filled in (a list of models
        or adapters as a dict, the PPO batch following the run's). The config keeps its values
        (numpy scalars become the equal Python ones), so validating twice gives the same run."""
        check_fields(self)
        cfg = dataclasses.replace(self)
        cfg._check_kinds()
        cfg._check_model_paths()
        method = resolve_method(cfg.method)  # once: the learner and its structure
        k = cfg.agents_count(method)
        names = list(agent_names(k))
        cfg._check_agents(k, names)
        cfg._check_task(k)
        cfg._check_numbers()
        super(TrainConfig, cfg).validate()  # the learner's: ppo (and its kl), sampling, t_rex, ...
        cfg._check_run(names, method)
        cfg._check_chain_fits(method, k)
        return self if cfg == self else cfg

    def _check_kinds(self) -> None:
        """A list of models or adapters read as one per agent; each nested setting's type."""
        for name in ("models", "adapters"):  # a list gives agent i the i-th entry
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                setattr(self, name, {f"llm_{i}": p for i, p in enumerate(value) if p is not None})
        for name, kind in (("ppo", PPOConfig), ("sampling", SamplingConfig), ("task_options", dict),
                           ("placement", dict), ("models", dict), ("adapters", dict)):  # early
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"TrainConfig.{name} must be a {kind.__name__}, got "
                                 f"{getattr(self, name)!r}")
        if self.lora is not None and not isinstance(self.lora, LoraSettings):
            raise ValueError(f"TrainConfig.lora must be None or a LoraSettings, got {self.lora!r}")
        if self.lora is not None:
            self.lora.check()

    def _check_model_paths(self) -> None:
        """The model, each agent's model or adapter, and each task option that names a path."""
        check_local_path("model", self.model)
        check_model(self.model)
        check_weights(self.model, "model")
        for kind in ("models", "adapters"):
            for agent, path in getattr(self, kind).items():
                if not isinstance(agent, str) or not isinstance(path, (str, os.PathLike)) \
                        or not str(path).strip():
                    raise ValueError(f"{kind}[{agent!r}] must be a model name or folder (a "
                                     f"string), got {path!r}")
                check_local_path(f"{kind}[{agent!r}]", path)
                if kind == "models":
                    check_model(path, f"models[{agent!r}]")
                check_weights(path, f"{kind}[{agent!r}]")
                if kind == "adapters":
                    check_adapter_base(path, self.model, f"adapters[{agent!r}]")
        for key, value in self.task_options.items():
            if not isinstance(key, str):
                raise ValueError(f"task option names must be strings, got {key!r}")
            check_local_path(f"task option {key}", value)

    def _check_agents(self, k: int, names: list[str]) -> None:
        """Models and adapters keyed by this run's agents, and given in one way."""
        for kind in ("models", "adapters"):
            for agent in getattr(self, kind):
                if agent not in names:
                    raise ValueError(f"{kind} key {agent!r} is not an agent of this run "
                                     f"({', '.join(names)})")
        if self.adapters and not self.shared_base:
            raise ValueError("adapters are LoRA adapters on one base: they need shared_base=True")
        if self.adapters and self.models:
            raise ValueError("give models (a model per agent) or adapters (an adapter per agent "
                             "on one base), not both")
        if self.adapters and self.lora is None and len(self.adapters) < k:
            missing = [a for a in names if a not in self.adapters]
            raise ValueError(f"adapters name no adapter for {missing}: give one for every agent "
                             f"or set lora for fresh adapters")

    def _check_task(self, k: int) -> None:
        """A registered task whose options its constructor takes, and lengths that fit it."""
        if not isinstance(self.task, str):
            return
        if self.task not in registered_tasks():
            raise ValueError(f"unknown task {self.task!r}; registered: {registered_tasks()}")
        try:  # its constructor checks the options (cheap: no data)
            task = make_task(self.task, **self.task_options)
        except (TypeError, ValueError) as err:
            raise ValueError(f"task {self.task!r} options {self.task_options}: {err}") from None
        self._check_lengths(task, k)

    def _check_numbers(self) -> None:
        """Counts and the seed; a mini-batch left at its default fits the batch."""
        check_int("iterations", self.iterations, 1)
        check_int("max_new_tokens", self.max_new_tokens, 1, none_ok=True)
        check_int("seed", self.seed, 0, 2 ** 32)  # what numpy and torch seed from
        mini_batch_follows(self, {"batch_size"} | ({"mini_batch_size"} if self.ppo.mini_batch_size
                                                    != PPO_DEFAULTS.mini_batch_size else set())
                           | ({"grad_accum_steps"} if self.ppo.grad_accum_steps
                              != PPO_DEFAULTS.grad_accum_steps else set()))

    def _check_run(self, names: list[str], method) -> None:
        """The group size, 4-bit loading, precision, switches and devices."""
        group = self.group_size or method.learner.group_size
        if self.batch_size % group:
            raise ValueError(f"batch_size={self.batch_size} must be divisible by the group size "
                             f"{group} (answers per query of {self.method!r}; set group_size)")
        EnvConfig(n_agents=len(names), rounds=self.rounds).validate()  # the env's own checks
        if method.structure.shared_policy:
            if not method.learner.shares_policy:
                raise ValueError(f"{self.method!r}: the {method.learner.name} learner cannot "
                                 f"train one shared policy on every position (ppo can)")
            if self.models or self.adapters:
                raise ValueError(f"{self.method!r} has one model for every position: models= "
                                 f"and adapters= per agent do not apply")
        if self.rounds > 1 and not method.learner.takes_rounds:
            raise ValueError(f"{self.method!r} cannot train on rounds={self.rounds} (its "
                             f"{method.learner.name} learner reads one round); use rounds=1")
        if self.load_in_4bit and self.lora is None:
            raise ValueError("load_in_4bit=True needs LoRA (set lora)")
        check_mixed_precision(self.mixed_precision)
        if self.decode not in DECODE_PATHS:
            raise ValueError(f"TrainConfig.decode must be one of {DECODE_PATHS}, got "
                             f"{self.decode!r}")
        for name in ("load_in_4bit", "shared_base", "torch_compile"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        check_device("device", self.device)
        models = [*names, *method.learner.extra_model_names]
        for agent, dev in self.placement.items():
            if agent not in models:
                raise ValueError(f"placement key {agent!r} must be one of {models}")
            check_device(f"placement[{agent!r}]", dev)

    def _check_lengths(self, task, k: int) -> None:
        """max_new_tokens against the task's context and each model's positions, for K agents
        (a chain's last prompt holds K − 1 answers, then its own)."""
        max_new = self.max_new_tokens or task.default_max_new_tokens
        if task.default_context_len <= max_new:
            raise ValueError(f"max_new_tokens={max_new} must be below the task "
                             f"{task.name!r}'s context length {task.default_context_len}")
        paths = {"model": self.model, **{f"models[{a!r}]": p for a, p in self.models.items()}}
        for what, path in paths.items():
            folder = os.path.expanduser(str(path)) if path is not None else None
            positions = model_positions(folder) if folder and os.path.isdir(folder) else None
            if positions is None:
                continue
            need = k * max_new + 1  # every answer of the chain, plus at least one query token
            if need > positions:
                raise ValueError(
                    f"{what}={str(path)!r} has {positions} positions, but n_agents={k} × "
                    f"max_new_tokens={max_new} = {k * max_new} answer tokens (+ the query) "
                    f"cannot fit; lower max_new_tokens or n_agents")

    def _check_chain_fits(self, method, k: int) -> None:
        """A chain (K > 2 agents, or rounds) fits each local model's positions: its longest
        prompt plus an answer, and for a model that reads the whole transcript (MAPPO's critic)
        every turn; refused here, naming the numbers, before any model loads."""
        if k * self.rounds <= 2 or not isinstance(self.task, str):
            return  # one or two turns: _check_lengths
        paths = {"model": self.model, **{f"models[{a!r}]": p for a, p in self.models.items()}}
        positions = {what: n for what, path in paths.items() if path is not None
                     and (n := _positions(path)) is not None}
        if not positions:
            return
        tokenizer = tokenizer_folder(self.models.get("llm_0", self.model))
        L, T, turns = chain_lengths(self.task, tuple(sorted(self.task_options.items())),
                                    tokenizer, k, self.rounds, self.max_new_tokens,
                                    method.structure.knowledge_transfer,
                                    method.structure.reward_mode)
        joint = bool(method.learner.joint_reader)
        need = L + (turns - 1) * T if joint else L
        for what, limit in positions.items():
            if need > limit:
                reads = (f"a critic reading all {turns} turns ({L} + {turns - 1} x {T})"
                         if joint else "its longest prompt and answer")
                raise ValueError(
                    f"n_agents={k} x rounds={self.rounds} does not fit {what}="
                    f"{str(paths[what])!r}: the chain needs {need} positions for {reads} "
                    f"(context {L}: the query, the templates and up to {turns - 1} earlier "
                    f"answers of max_new_tokens={T}), the model has {limit}; use fewer agents "
                    f"or rounds, a smaller max_new_tokens, or a model with more positions")

    def agents_count(self, method=None) -> int:
        """K: n_agents, else the method's default; a ValueError naming a K it cannot train
        (`method`: the method already resolved)."""
        method = method or resolve_method(self.method)
        default, k = method.n_agents, self.n_agents
        if k is None:
            k = default
        check_int("n_agents", k, 1)
        if k < method.learner.min_agents:
            raise ValueError(f"{self.method!r}: the {method.learner.name} learner needs "
                             f"{method.learner.min_agents}+ agents, the structure gives {k}")
        if self.n_agents is None:
            return k
        if default == 1 and k != 1:
            raise ValueError(f"{self.method!r} is a single-agent learner: n_agents={k} "
                             f"needs a multi-agent method (cory, ippo, mappo, cory-grpo, ...)")
        if default > 1 and k < 2:
            raise ValueError(f"{self.method!r} trains a chain of agents: n_agents={k} must be "
                             f">= 2 (ppo is the single-agent baseline)")
        return k


def add_train_options(parser, skip: tuple[str, ...] = ()) -> dict:
    """An option per TrainConfig field (but `skip`) plus --import; returns {dest: path}."""
    paths = add_options(parser, TrainConfig, TrainConfig(), skip=skip)
    add_import_option(parser)
    return paths


def train_config_from(args, paths: dict, **fixed) -> TrainConfig:
    """The validated TrainConfig of parsed options (`--import` loaded first; `fixed` fields
    set too); a ValueError naming the bad value, before any model loads."""
    load_plugins(getattr(args, "imports", None))
    given = {paths[k]: v for k, v in vars(args).items() if k in paths}
    cfg = dataclasses.replace(apply(TrainConfig(), given), **fixed)
    try:
        return mini_batch_follows(cfg, {path[-1] for path in given}).validate()
    except ValueError as err:  # name the option typed, not only the field
        raise ValueError(in_flags(str(err), TrainConfig)) from None


def mini_batch_follows(cfg: TrainConfig, given: set[str]) -> TrainConfig:
    """The one batch-fitting rule: when the batch size is among the `given` settings and
    neither mini_batch_size nor grad_accum_steps is, the PPO mini-batch shrinks to fit it (the
    whole batch, or batch / grad_accum_steps when that divides it); a fitting one is kept."""
    ppo, b = cfg.ppo, cfg.batch_size
    if "batch_size" not in given or {"mini_batch_size", "grad_accum_steps"} & given:
        return cfg
    if not isinstance(b, int) or b < 1 or b % ppo.backward_batch_size == 0:
        return cfg
    accum = ppo.grad_accum_steps if b % ppo.grad_accum_steps == 0 else 1
    cfg.ppo = dataclasses.replace(ppo, mini_batch_size=b // accum, grad_accum_steps=accum)
    return cfg


def more_samples(cfg: TrainConfig, k: int) -> TrainConfig:
    """cfg with k times the episodes per iteration and as many optimizer steps (each step's
    batch grows k-fold through gradient accumulation, so a pass holds as many rows)."""
    ppo = dataclasses.replace(cfg.ppo, grad_accum_steps=cfg.ppo.grad_accum_steps * k)
    return dataclasses.replace(cfg, batch_size=cfg.batch_size * k, ppo=ppo)


def check_device(name: str, dev, present: bool = False) -> None:
    """Raise ValueError naming the field if dev is not a device (or, if present=True, a CUDA
    device this machine does not have)."""
    try:
        d = torch.device(dev)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{name}={dev!r} is not a device: {e}") from None
    if present and d.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (d.index or 0) >= n:
            raise ValueError(f"{name}={dev!r} but {n} CUDA device(s) are visible")


def catalogue() -> str:
    """The registered methods, tasks and each task's options, for a CLI's --help."""
    lines = ["methods (a learner on a structure; --import adds yours; any learner/structure "
             "is one too, structures: " + ", ".join(registered_structures()) + "):",
             "  " + ", ".join(registered_methods()), "tasks and their options (--task-options "
             "k=v,...; a task's tokenizer defaults to --model's when it takes one):"]
    for task in registered_tasks():
        opts = ", ".join(f"{k}={v!r}" for k, v in task_defaults(task).items())
        lines.append(f"  {task}: {opts or '(none)'}")
    return "\n".join(lines)


def _positions(path) -> int | None:
    """The positions of a local model folder (None: not local, or not said)."""
    folder = os.path.expanduser(str(path))
    return model_positions(folder) if os.path.isdir(folder) else None


def tokenizer_folder(path) -> str | None:
    """The model folder when it holds a tokenizer (the env then builds prompts with it), else
    None."""
    folder = os.path.expanduser(str(path)) if path is not None else None
    if folder and os.path.isdir(folder) and any(f.startswith("tokenizer")
                                                for f in os.listdir(folder)):
        return folder
    return None


@functools.lru_cache(maxsize=64)
def chain_lengths(task: str, options: tuple, tokenizer: str | None, k: int, rounds: int,
                  max_new_tokens: int | None, knowledge_transfer: bool, reward_mode: str
                  ) -> tuple[int, int, int]:
    """(context L, answer T, turns) of a chain's episodes, as the env lays them out (its
    templates and the split's longest query; no model is loaded)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = EnvConfig(task=make_task(task, **dict(options)), tokenizer=tokenizer, n_agents=k,
                       rounds=rounds, max_new_tokens=max_new_tokens,
                       knowledge_transfer=knowledge_transfer,
                       reward_mode=reward_mode).episodes()
    return ep.L, ep.T, ep.n_turns
