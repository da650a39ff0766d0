"""The training loop: build the env, the policies and a learner; iterate rollout -> update.

    from agents.training.train import TrainConfig, Trainer
    trainer = Trainer(TrainConfig(task="sentiment", method="cory", model="path/to/lm"))
    for metrics in trainer.run():
        print(metrics["llm_0"]["task_reward"])

A method is an algorithm on a structure (`agents.learners.base.resolve_method`): a registered name
(`registered_methods()`) or `algorithm/structure`. TrainConfig extends the LearnerConfig (the
learner's own settings are declared once, there).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from cory_env import BatchedCoryEnv
from cory_env.aec import agent_names
from cory_env.checks import check_int
from cory_env.config import check_fields, meta
from cory_env.files import check_local_path
from cory_env.pretrained import check_model, resolve_model

from ..learners.base import LearnerConfig, resolve_method
from ..learners.comm import Comm
from ..learners.ppo import KLConfig, PPOConfig
from ..llm.loading import (
    LoraSettings,
    check_adapter_base,
    check_weights,
    config_positions,
    model_positions,
)
from ..llm.policy import LLMPolicy
from ..llm.rollout import rollout
from ..llm.sampling import SamplingConfig
from ..llm.speed import check_mixed_precision


@dataclass
class TrainConfig(LearnerConfig):
    """One training run: task, method, model and every hyperparameter (the learner's own
    settings, `ppo`, `sampling`, `t_rex`, ..., are LearnerConfig's fields)."""

    task: str = field(default="sentiment", metadata=meta(
        "task name (cory_env.registered_tasks)", check=False))  # or a Task class / instance
    method: str = field(default="cory", metadata=meta(
        "method: a registered name (registered_methods) or algorithm/structure"))
    model: str | None = field(default=None, metadata=meta(
        "HF name or local folder; none: the offline task's reference LM"))
    n_agents: int | None = field(default=None, metadata=meta(
        "K agents in the chain (none: the method's default, 2; 1 for ppo)"))
    models: dict[str, str] = field(default_factory=dict, metadata=meta(
        "a model per agent, e.g. llm_1=path/to/other (one tokenizer for all; in Python also a "
        "list, entry i for llm_i)"))
    adapters: dict[str, str] = field(default_factory=dict, metadata=meta(
        "a PEFT LoRA adapter folder per agent on the one base model (or a list)"))
    iterations: int = field(default=20, metadata=meta("training iterations"))
    batch_size: int = field(default=32, metadata=meta("episodes per iteration"))
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
    torch_compile: bool = field(default=False, metadata=meta(
        "torch.compile the training passes (compiled on first use)"))
    placement: dict[str, str] = field(default_factory=dict, metadata=meta(
        "device per model, e.g. llm_0=cuda:0,llm_1=cuda:1,critic=cuda:1"))
    task_options: dict = field(default_factory=dict, metadata=meta("task keywords k=v,..."))
    # The offline default, as the benchmark trains: the paper's IMDB PPO table but lr 1e-4
    # (20 x 32 episodes are ~40x fewer samples than its 100 x 256) and one 32-row mini-batch.
    # The KL horizon scales with the batch (10000 x 32 / 256 here), so beta adapts per
    # iteration as fast as in the paper's batch-256 runs (`--no-scale-kl-horizon`: raw).
    ppo: PPOConfig = field(default_factory=lambda: PPOConfig(
        lr=1e-4, batch_size=32, mini_batch_size=32,
        kl=KLConfig(penalty="full", scale_horizon=True)))

    def validate(self) -> TrainConfig:
        """Check the config before any model is loaded, naming the bad field."""
        check_fields(self)
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
        from cory_env import registered_tasks

        k = self.agents_count()
        names = list(agent_names(k))
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
        if isinstance(self.task, str) and self.task not in registered_tasks():
            raise ValueError(f"unknown task {self.task!r}; registered: {registered_tasks()}")
        if isinstance(self.task, str):  # its constructor checks the options (cheap: no data)
            from cory_env import make_task

            try:
                task = make_task(self.task, **self.task_options)
            except (TypeError, ValueError) as err:
                raise ValueError(f"task {self.task!r} options {self.task_options}: {err}") \
                    from None
            self._check_lengths(task, k)
        check_int("iterations", self.iterations, 1)
        check_int("batch_size", self.batch_size, 1)
        check_int("max_new_tokens", self.max_new_tokens, 1, none_ok=True)
        check_int("seed", self.seed, 0, 2 ** 32)  # what numpy and torch seed from
        default = TrainConfig.__dataclass_fields__["ppo"].default_factory()
        if all(getattr(self.ppo, f.name) == getattr(default, f.name)
               for f in dataclasses.fields(PPOConfig) if f.name != "batch_size"):
            mini_batch_follows(self, {"batch_size"})  # no PPO setting was given
        if self.ppo.batch_size != self.batch_size:
            self.ppo = dataclasses.replace(self.ppo, batch_size=self.batch_size)
        super().validate()  # the learner's settings: ppo (and its kl), sampling, t_rex, ...
        group = self.group_size or resolve_method(self.method).algorithm.group_size
        if self.batch_size % group:
            raise ValueError(f"batch_size={self.batch_size} must be divisible by the group size "
                             f"{group} (answers per query of {self.method!r}; set group_size)")
        if self.load_in_4bit and self.lora is None:
            raise ValueError("load_in_4bit=True needs LoRA (set lora)")
        check_mixed_precision(self.mixed_precision)
        for name in ("load_in_4bit", "shared_base", "torch_compile"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        check_device("device", self.device)
        models = [*names, *resolve_method(self.method).algorithm.extra_model_names]
        for agent, dev in self.placement.items():
            if agent not in models:
                raise ValueError(f"placement key {agent!r} must be one of {models}")
            check_device(f"placement[{agent!r}]", dev)
        return self

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

    def agents_count(self) -> int:
        """K: n_agents, else the method's default; a ValueError naming a K it cannot train."""
        default = resolve_method(self.method).n_agents
        k = self.n_agents
        if k is None:
            return default
        check_int("n_agents", k, 1)
        if default == 1 and k != 1:
            raise ValueError(f"{self.method!r} is a single-agent learner: n_agents={k} "
                             f"needs a multi-agent method (cory, ippo, mappo, cory-grpo, ...)")
        if default > 1 and k < 2:
            raise ValueError(f"{self.method!r} trains a chain of agents: n_agents={k} must be "
                             f">= 2 (ppo is the single-agent baseline)")
        return k


def add_train_options(parser, skip: tuple[str, ...] = ()) -> dict:
    """An option per TrainConfig field (but `skip`) plus --import; returns {dest: path}."""
    from .cli import add_options

    paths = add_options(parser, TrainConfig, TrainConfig(), skip=skip)
    parser.add_argument("--import", dest="imports", action="append", metavar="MODULE_OR_FILE",
                        help="module or .py file that registers learners or tasks (repeatable)")
    return paths


def train_config_from(args, paths: dict, **fixed) -> TrainConfig:
    """The validated TrainConfig of parsed options (`--import` loaded first; `fixed` fields
    set too); a ValueError naming the bad value, before any model loads."""
    from cory_env.plugins import load_plugins

    from .cli import apply

    load_plugins(getattr(args, "imports", None))
    given = {paths[k]: v for k, v in vars(args).items() if k in paths}
    cfg = dataclasses.replace(apply(TrainConfig(), given), **fixed)
    return mini_batch_follows(cfg, {path[-1] for path in given}).validate()


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
    cfg.ppo = dataclasses.replace(ppo, batch_size=b, mini_batch_size=b // accum,
                                  grad_accum_steps=accum)
    return cfg


# Settings that earlier versions saved under other names (run folders, checkpoints):
# old dotted path -> today's (None: no longer a setting)
RENAMED = {"ppo.init_kl_coef": "ppo.kl.beta", "ppo.adap_kl_ctrl": "ppo.kl.adaptive",
           "ppo.kl_target": "ppo.kl.target", "ppo.kl_horizon": "ppo.kl.horizon",
           "ppo.scale_kl_horizon": "ppo.kl.scale_horizon", "ppo.kl_penalty": "ppo.kl.penalty",
           "ppo.kl_in": "ppo.kl.where", "ppo.kl_loss_estimator": "ppo.kl.loss_estimator",
           "group_kl_in": None}


def upgrade_settings(saved: dict) -> dict:
    """A TrainConfig's saved settings (nested as `dataclasses.asdict` writes them, or flat by
    dotted path) in today's names; where the KL acts is kept only when an earlier version
    was told something other than its default."""
    flat = not any(isinstance(v, dict) and k in ("ppo", "sampling") for k, v in saved.items())
    out = copy.deepcopy(saved)
    old_group = _pop(out, "group_kl_in", flat)
    for old, new in RENAMED.items():
        value = _pop(out, old, flat)
        if value is _MISSING or new is None:
            continue
        if new == "ppo.kl.where":
            value = "loss" if value == "loss" else ("reward" if old_group == "reward" else None)
        if flat:
            out[new] = value
        else:
            node = out
            for part in new.split(".")[:-1]:
                node = node.setdefault(part, {})
            node[new.split(".")[-1]] = value
    return out


_MISSING = object()


def _pop(d: dict, path: str, flat: bool):
    if flat:
        return d.pop(path, _MISSING)
    *parents, last = path.split(".")
    for part in parents:
        d = d.get(part)
        if not isinstance(d, dict):
            return _MISSING
    return d.pop(last, _MISSING)


def more_samples(cfg: TrainConfig, k: int) -> TrainConfig:
    """cfg with k times the episodes per iteration and as many optimizer steps (each step's
    batch grows k-fold through gradient accumulation, so a pass holds as many rows)."""
    ppo = dataclasses.replace(cfg.ppo, batch_size=cfg.batch_size * k,
                              grad_accum_steps=cfg.ppo.grad_accum_steps * k)
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


def oom_advice(cfg: TrainConfig, phase: str) -> str:
    """What to change after running out of accelerator memory in phase "rollout" or "update"."""
    ppo = cfg.ppo
    tips = []
    if phase == "update" and ppo.mini_batch_size > 1:
        k = next(k for k in range(2, ppo.mini_batch_size + 1) if ppo.mini_batch_size % k == 0)
        tips.append(f"a smaller PPO mini-batch with gradient accumulation, same optimizer batch: "
                    f"ppo.mini_batch_size={ppo.mini_batch_size // k}, ppo.grad_accum_steps="
                    f"{ppo.grad_accum_steps * k} (now "
                    f"mini_batch_size={ppo.mini_batch_size}, "
                    f"grad_accum_steps={ppo.grad_accum_steps})")
    tips.append(f"a smaller rollout batch: batch_size={max(cfg.batch_size // 2, 1)} (now "
                f"{cfg.batch_size}; keep it divisible by mini_batch_size * grad_accum_steps)")
    if phase == "rollout" and cfg.max_new_tokens:
        tips.append(f"shorter responses: max_new_tokens (now {cfg.max_new_tokens})")
    if cfg.lora is None:
        tips.append("LoRA: lora=LoraSettings(r=16) with shared_base=True (one frozen base for "
                    "both agents; the reference is the base with the adapter off)")
    if not cfg.load_in_4bit:
        tips.append("a 4-bit base: load_in_4bit=True with LoRA (CUDA + bitsandbytes)")
    tips.append('one GPU per agent: placement={"llm_0": "cuda:0", "llm_1": "cuda:1"}')
    tips.append("less fragmentation: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    return "\n".join(f"  - {t}" for t in tips)


@contextmanager
def oom_guard(cfg: TrainConfig, phase: str):
    """Turn an out-of-memory error into one that says what to change (the cause is chained)."""
    try:
        yield
    except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError
        if not (isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()):
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise torch.OutOfMemoryError(
            f"out of memory during the {phase} (method={cfg.method}, batch_size="
            f"{cfg.batch_size}, ppo.mini_batch_size={cfg.ppo.mini_batch_size}, "
            f"ppo.grad_accum_steps={cfg.ppo.grad_accum_steps}): {first}\nTry:\n"
            f"{oom_advice(cfg, phase)}") from e


def default_model(task) -> str:
    """The task's offline reference LM folder (`Task.offline_model`; built and cached on first
    use); a ValueError when the task has none."""
    from cory_env import offline_model

    from ..refmodels import reference_lm

    recipe = offline_model(task)
    if recipe is None:
        name = task if isinstance(task, str) else getattr(task, "name", task)
        raise ValueError(f"task {name!r} has no offline reference LM: give a model (--model)")
    return str(reference_lm(recipe))


def model_of(cfg: TrainConfig, agent: str) -> str | None:
    """The model an agent starts from: models[agent], else model (None: the offline LM); a
    short name or a GGUF file as its converted local folder."""
    return resolve_model(cfg.models.get(agent, cfg.model))


def tokenizer_folder(model: str | None) -> str | None:
    """The model folder when it holds a tokenizer, else None."""
    import os

    if model and os.path.isdir(model) and any(f.startswith("tokenizer")
                                              for f in os.listdir(model)):
        return model
    return None


def check_tokenizers(cfg: TrainConfig, agents: list[str], task) -> None:
    """A ValueError naming both sides when an agent's model folder holds a tokenizer other
    than the one the env builds prompts with (llm_0's folder's, else the task's): each agent
    reads the others' token ids, so they must share one."""
    folders = {a: tokenizer_folder(model_of(cfg, a)) for a in agents}
    if not any(folders[a] for a in agents[1:]):
        return  # every agent reads the env's tokenizer
    from cory_env.config import load_tokenizer

    if folders[agents[0]]:
        want, label = load_tokenizer(folders[agents[0]]), f"{agents[0]}'s model " \
            f"{folders[agents[0]]!r}"
    else:
        want, label = task.tokenizer, f"the task's tokenizer ({agents[0]}'s)"
    for agent in agents[1:]:
        other = folders[agent]
        if not other or other == folders[agents[0]]:
            continue
        diff = tokenizer_difference(want, load_tokenizer(other))
        if diff:
            raise ValueError(f"{agent}'s model {other!r} and {label} have different "
                             f"tokenizers ({diff}): agents in one chain must share a tokenizer, "
                             f"because each reads the others' token ids")


def tokenizer_difference(a, b) -> str:
    """What differs between two tokenizers ('' when they map every token alike)."""
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} tokens"
    if a.eos_token_id != b.eos_token_id:
        return f"eos ids {a.eos_token_id} vs {b.eos_token_id}"
    va, vb = a.get_vocab(), b.get_vocab()
    for token, i in va.items():
        if vb.get(token) != i:
            return f"token {token!r} is id {i} vs {vb.get(token)}"
    return ""


def check_positions(env, policies: dict, joint: tuple[str, ...] = ()) -> None:
    """Warn, naming the numbers, when a chain's longest sequence (the whole transcript for the
    `joint` models, e.g. MAPPO's critic) can exceed what a model's position embeddings reach."""
    ep = env.episodes
    if ep.n_turns <= 2:
        return
    for name, policy in policies.items():
        config = policy.hf_model.config
        limit = config_positions(config)
        need = ep.L + (ep.n_turns - 1) * ep.T if name in joint else ep.L
        if limit and need > limit:
            warnings.warn(f"{name}'s model reads at most {limit} positions, but a chain of "
                          f"{ep.n_turns} agents can need {need} tokens (context {ep.L}, "
                          f"{ep.T} per answer): use fewer agents, a smaller max_new_tokens, or "
                          f"a model with more positions", stacklevel=3)


def build_policies(cfg: TrainConfig, agents: list[str], extra: tuple[str, ...] = ()) -> dict:
    """One policy per agent, plus one per `extra` model name (a learner's own, e.g. MAPPO's
    critic). Agents that start from the same model share its frozen reference; each agent's
    reference is its own initial model."""
    torch.manual_seed(cfg.seed)
    named = {a: model_of(cfg, a) for a in agents}  # None: the offline task's reference LM
    offline = default_model(cfg.task) if None in named.values() else None
    paths = {a: m or offline for a, m in named.items()}
    where = {a: cfg.placement.get(a, cfg.device) for a in [*agents, *extra]}
    kw = {"load_in_4bit": cfg.load_in_4bit, "mixed_precision": cfg.mixed_precision}
    lora = cfg.lora is not None or bool(cfg.adapters)
    if lora and cfg.shared_base and len(agents) > 1 and len(set(paths.values())) == 1:
        team = LLMPolicy.shared_lora(paths[agents[0]], cfg.lora, names=tuple(agents),
                                     adapters=cfg.adapters, device=where[agents[0]], **kw)
        policies = dict(zip(agents, team))
    elif lora:
        policies = {a: LLMPolicy.from_pretrained(paths[a], lora=cfg.lora, device=where[a],
                                                 adapter_name=a, **kw) for a in agents}
    else:
        policies = {}
        for a in agents:
            twin = next((b for b in policies if paths[b] == paths[a]), None)
            if twin is None:
                policies[a] = LLMPolicy.from_pretrained(paths[a], reference="copy",
                                                        device=where[a],
                                                        mixed_precision=cfg.mixed_precision)
                continue
            first = policies[twin]
            lm = copy.deepcopy(first.model).to(where[a])
            ref = first.ref_model if where[a] == where[twin] else \
                copy.deepcopy(first.ref_model).to(where[a])
            policies[a] = LLMPolicy(lm, reference=ref, mixed_precision=cfg.mixed_precision)
            policies[a].value_head.load_state_dict(first.value_head.state_dict())
    for name in extra:  # on the first agent's model, whose tokenizer the env uses
        policies[name] = LLMPolicy.from_pretrained(paths[agents[0]], reference=None,
                                                   device=where[name],
                                                   mixed_precision=cfg.mixed_precision)
    for policy in policies.values():  # the token cap of training passes bounds prompt passes too
        policy.prefill_chunk_tokens = cfg.ppo.max_tokens_per_pass
        policy.compile_training = cfg.torch_compile
    return policies


class Trainer:
    """Rollout -> update iterations of one method on one task, deterministic under cfg.seed."""

    def __init__(self, cfg: TrainConfig, env_options: dict | None = None,
                 comm: Comm | None = None):
        self.cfg = cfg.validate()
        check_device("device", cfg.device, present=True)  # here, before any model loads
        for agent, dev in cfg.placement.items():
            check_device(f"placement[{agent!r}]", dev, present=True)
        self.method = resolve_method(cfg.method)
        self.learner_cls = self.method.algorithm
        if self.learner_cls.batch_multiplier > 1:
            self.cfg = cfg = more_samples(cfg, self.learner_cls.batch_multiplier)
        agents = list(agent_names(cfg.agents_count()))
        tokenizer, task = self._tokenizer(), self._task()
        check_tokenizers(cfg, agents, task)
        names = self.learner_cls.extra_model_names
        policies = build_policies(cfg, agents, names)
        extra = {name: policies.pop(name) for name in names}
        self.learner = self.learner_cls(policies, cfg.learner_part(), seed=cfg.seed, comm=comm,
                                        structure=self.method.structure, **extra)
        self.env = BatchedCoryEnv(batch_size=cfg.batch_size, task=task,
                                  tokenizer=tokenizer, max_new_tokens=cfg.max_new_tokens,
                                  seed=cfg.seed, **self.learner.env_settings(),
                                  **(env_options or {}))
        self.learner.attach(self.env)
        vocab = len(self.env.tokenizer)
        for name, policy in {**policies, **extra}.items():
            if policy.vocab_size < vocab:
                raise ValueError(
                    f"{name}'s model ({model_of(cfg, name) or 'the offline reference LM'}) has "
                    f"{policy.vocab_size} token embeddings but the task's tokenizer has {vocab} "
                    f"tokens: use the model's own tokenizer (task option tokenizer=) or a "
                    f"model built for this task")
        check_positions(self.env, {**policies, **extra}, self.learner_cls.joint_reader)
        self.iteration = 0
        self.query_sampler = None  # iteration -> query indices (per-rank data shards)

    def _task(self):
        """The task (a `takes_run_tokenizer` task adopts the model's tokenizer in the env)."""
        from cory_env import make_task

        return make_task(self.cfg.task, **self.cfg.task_options)

    def _tokenizer(self):
        """The (first agent's) model folder's tokenizer when it has one, else the task's."""
        return tokenizer_folder(model_of(self.cfg, "llm_0"))

    def step(self) -> dict:
        """One iteration: rollout with the scheduled roles, update, metrics."""
        t0 = time.perf_counter()
        options = self.learner.reset_options(self.iteration)
        if self.query_sampler is not None:
            options = {**options, "queries": self.query_sampler(self.iteration)}
        with oom_guard(self.cfg, "rollout"), self.rollout_context():
            turns = rollout(self.env, self.learner.policies, self.learner.sampling,
                            self.learner.generator, reset_options=options)
        t1 = time.perf_counter()
        with oom_guard(self.cfg, "update"):
            stats = self.learner.update(turns, self.iteration)
        metrics = self.learner.metrics(turns, stats)
        metrics["iteration"] = self.iteration
        metrics["rotation"] = int(options.get("rotation", 0)) % max(len(self.learner.policies), 1)
        metrics["time_rollout_s"], metrics["time_update_s"] = t1 - t0, time.perf_counter() - t1
        self.iteration += 1
        return metrics

    def rollout_context(self):
        """A context the rollout runs in (multi-process subclasses gather sharded weights)."""
        return contextlib.nullcontext()

    def run(self):
        """Yield metrics of the remaining iterations."""
        while self.iteration < self.cfg.iterations:
            yield self.step()

    def save(self, path: str) -> None:
        """Atomically checkpoint the full training state."""
        from .checkpoint import save_checkpoint

        save_checkpoint(self, path)

    def load(self, path: str) -> None:
        """Continue from a checkpoint written by save()."""
        from .checkpoint import load_checkpoint

        load_checkpoint(self, path)
