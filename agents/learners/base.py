"""Learners: the swappable training algorithms that turn rollouts into updates, and the method
names.

A learner owns one `PPOAgent` (policy + optimizer + KL controller + score statistics) per LLM,
runs on a `Structure` (`agents.learners.structure`: the env's agent count, knowledge transfer,
reward mode and role schedule), says which roles to play each iteration (`reset_options`), and
updates from the finished turns (`update`). To add a learner, subclass `Learner` in one file
and decorate it with `@register_learner("name")`; `agents/learners/reinforce.py` is the worked
example, and `agents/learners/cory.py` is CORY. A method name resolves to a learner on a
structure (`resolve_method`): the registered names, or any `learner/structure`.

Multi-process training reaches a learner only through `self.comm` (`agents.learners.comm.Comm`):
its agents call it to prepare their models, back-propagate, and agree on statistics across ranks.
"""

from __future__ import annotations

import copy
import functools
import importlib
import math
import pkgutil
from dataclasses import dataclass, field, fields, replace

import torch

from cory_common.checks import check_fields, check_int, meta
from cory_common.plugins import check_not_builtin, load_entry_points
from cory_env.chain import copy_rate

from ..llm.rollout import Turn
from ..llm.sampling import SamplingConfig
from .comm import Comm
from .credit import credit_span
from .metrics import last_round, report_kl_coef_of, turn_metrics
from .ppo import (
    PPOBatch,
    PPOConfig,
    kl_per_token,
    masked_mean,
    masked_var,
    ppo_update,
)
from .shaping import (
    RunningMoments,
    make_kl_controller,
    scale_scores,
    token_rewards,
    truncated_is_weights,
)
from .structure import INDEPENDENT, SINGLE, Structure, structures


@dataclass
class LearnerConfig:
    """What a learner needs besides its policies: the batch, PPO settings (with the KL's),
    sampling, the role-exchange period and group settings. `TrainConfig` extends it."""

    batch_size: int = field(default=32, metadata=meta("episodes per iteration"))
    ppo: PPOConfig = field(default_factory=PPOConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    t_rex: int = field(default=5, metadata=meta(
        "role-exchange period T_REx: iterations between rotations"))
    report_kl_coef: float | None = field(default=None, metadata=meta(
        "KL coefficient c of the reported combined reward r - c * KL; reporting only, training "
        "uses kl_coef (none: the initial kl_coef)"))
    group_size: int | None = field(default=None, metadata=meta(
        "answers per query G (none: the learner's default; 4 for grpo, dr-grpo, rloo)"))
    per_agent_norm: bool = field(default=True, metadata=meta(
        "two agents: normalise advantages per agent, not over both (Dr. MAS)"))

    def validate(self) -> LearnerConfig:
        """Raise ValueError naming the bad field."""
        check_fields(self)
        check_int("batch_size", self.batch_size, 1)
        check_int("t_rex", self.t_rex, 1)
        check_int("group_size", self.group_size, 1, none_ok=True)
        if self.report_kl_coef is not None and not (math.isfinite(self.report_kl_coef)
                                                    and self.report_kl_coef >= 0):
            raise ValueError(f"report_kl_coef must be None or a finite number >= 0, got "
                             f"{self.report_kl_coef!r}")
        for name, kind in (("ppo", PPOConfig), ("sampling", SamplingConfig)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"{type(self).__name__}.{name} must be a {kind.__name__}, got "
                                 f"{getattr(self, name)!r}")
        self.ppo.validate()
        self.sampling.validate()
        if self.batch_size % self.ppo.backward_batch_size:
            raise ValueError(f"batch_size={self.batch_size} must be divisible by mini_batch_size"
                             f" * grad_accum_steps = {self.ppo.mini_batch_size} * "
                             f"{self.ppo.grad_accum_steps} = {self.ppo.backward_batch_size}")
        return self

    def learner_part(self) -> LearnerConfig:
        """The LearnerConfig fields of this config (of a TrainConfig: without the rest)."""
        return LearnerConfig(**{f.name: getattr(self, f.name) for f in fields(LearnerConfig)})


def adam(params, lr: float) -> torch.optim.Adam:
    """Adam, using the fused kernel where every parameter lives on a device that has one."""
    params = list(params)
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda")
                                 for p in params)
    return torch.optim.Adam(params, lr=lr, fused=fused or None)


class PPOAgent:
    """One LLM's learning state: policy, Adam, KL controller and running score statistics.

    `policy` is what training passes go through (`comm.prepare` of the rollout's policy); the
    KL controller and the score statistics see the global batch through `comm`.
    """

    def __init__(self, policy, cfg: PPOConfig, batch_size: int,
                 sampling: SamplingConfig | None = None, comm: Comm | None = None):
        self.comm = comm or Comm()
        self.policy, self.cfg, self.sampling = self.comm.prepare(policy), cfg, sampling
        self.optimizer = adam(self.policy.trainable_parameters(), cfg.lr)
        self.kl_controller = make_kl_controller(cfg, batch_size)
        self.score_stats = RunningMoments()

    @property
    def kl_coef(self) -> float:
        """The current KL coefficient."""
        return float(self.kl_controller.coef)

    def penalty(self, turn: Turn) -> torch.Tensor:
        """The per-token KL estimate chosen by cfg.kl.penalty, masked."""
        if self.cfg.kl.penalty == "full":
            return turn.full_kl
        return kl_per_token(turn.raw_logprobs, turn.ref_logprobs, self.cfg.kl.penalty) \
            * turn.response_mask

    def batch(self, turn: Turn, scores: torch.Tensor | None = None) -> PPOBatch:
        """Shape a turn into a PPO batch: -kl_coef*KL per token plus the score on the last one."""
        if self.recomputes:
            turn = self.recompute(turn)
        scores = scale_scores(turn.reward if scores is None else scores, self.score_stats,
                              self.cfg, gather=self.comm.gather)
        coef = 0.0 if self.cfg.kl.where == "loss" else self.kl_coef
        rewards = token_rewards(scores, self.penalty(turn), turn.response_mask, coef)
        return PPOBatch(input_ids=turn.input_ids, attention_mask=turn.attention_mask,
                        response_mask=turn.response_mask, old_logprobs=turn.logprobs,
                        old_values=turn.values, ref_logprobs=turn.ref_logprobs, rewards=rewards,
                        scores=scores, rounds=turn.rounds,
                        is_weights=truncated_is_weights(turn, self.cfg.tis_cap))

    @property
    def recomputes(self) -> bool:
        """Whether old log-probs and values are recomputed here (cfg.old_logprobs="recompute";
        "auto" needs no pass here: the rollout already made one where decoding differs)."""
        return self.cfg.old_logprobs == "recompute"

    def recompute(self, turn: Turn) -> Turn:
        """Old log-probs and values from a full pass (4-bit / bf16 decoding differs from it)."""
        with torch.no_grad():
            ev = self.policy.evaluate(turn.input_ids, turn.attention_mask,
                                      turn.response_mask.shape[1], sampling=self.sampling)
        turn.logprobs = ev.logprobs.float() * turn.response_mask
        turn.values = ev.values.float() * turn.response_mask
        return turn

    def learn(self, batch: PPOBatch, turn: Turn, generator, accumulate: int = 1
              ) -> dict[str, float]:
        """Run PPO on the batch (each optimizer step over `accumulate` times the configured
        rows), then update the KL coefficient from this batch's KL."""
        cfg = self.cfg if accumulate == 1 else \
            replace(self.cfg, grad_accum_steps=self.cfg.grad_accum_steps * accumulate)
        stats = ppo_update(self.policy, self.optimizer, batch, cfg, generator=generator,
                           kl_coef=self.kl_coef, evaluate_kwargs={"sampling": self.sampling},
                           backward=self.comm.backward, all_ok=self.comm.all_ok)
        stats["kl_coef"] = self.kl_coef
        kl = self.comm.mean(float(self.penalty(turn).sum(1).mean()))
        self.kl_controller.update(kl, len(batch) * self.comm.world_size)
        return stats

    def state_dict(self) -> dict:
        """Optimizer, KL controller and score statistics (weights are saved by the policy)."""
        return {"optimizer": self.optimizer.state_dict(), "kl": self.kl_controller.state_dict(),
                "score_stats": self.score_stats.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict saved."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.kl_controller.load_state_dict(state["kl"])
        self.score_stats.load_state_dict(state["score_stats"])


def joint_whiten(advantages: list[torch.Tensor], masks: list[torch.Tensor],
                 gather=None) -> list[torch.Tensor]:
    """Whiten several (B, T) advantages with one mean and std over all their masked tokens
    (and, with `gather` = `comm.gather`, over every rank's)."""
    gather = gather or (lambda x: x)
    dev = advantages[0].device
    x = torch.cat([gather(a.to(dev)).flatten() for a in advantages])
    m = torch.cat([gather(m.to(dev)).flatten() for m in masks])
    mean, var = masked_mean(x, m), masked_var(x, m)  # masked_whiten's statistics, pooled
    return [torch.where(mk > 0, (a - mean.to(a.device)) * torch.rsqrt(var.to(a.device) + 1e-8),
                        torch.zeros_like(a)) for a, mk in zip(advantages, masks)]


def norm_groups(agents: list[str], per_agent: bool) -> list[list[str]]:
    """The agents whose advantages share one normalisation: each alone (`per_agent_norm`, the
    default), or all together. Every learner's per-agent branch is this one."""
    return [[a] for a in agents] if per_agent else [list(agents)]


def whiten_agents(values: dict[str, torch.Tensor], masks: dict[str, torch.Tensor],
                  per_agent: bool, gather=None) -> dict[str, torch.Tensor]:
    """Each agent's (B, T) values whitened over its own masked tokens, or over every agent's
    together (`joint_whiten` per `norm_groups`)."""
    out = {}
    for members in norm_groups(list(values), per_agent):
        white = joint_whiten([values[a] for a in members], [masks[a] for a in members], gather)
        out.update(zip(members, white))
    return out


class Learner:
    """Base learner: one PPOAgent per LLM; subclasses override `update` (and maybe more).

    `structure` is the env structure it trains on (the class attribute is the default for a
    learner registered without one: two independent agents).
    """

    name = "base"
    structure: Structure = INDEPENDENT
    kl_where = "reward"  # where kl_coef acts when KLConfig.where is None: "reward" or "loss"
    kl_where_fixed = False  # True: the learner only works with kl_where (refuses the other)
    # Models the learner owns beside the agents' policies, by name: the Trainer builds each
    # (on the first agent's model, no reference) and passes it as a keyword; checkpoints,
    # placement and the distributed trainer read them through `extra_models`.
    extra_model_names: tuple[str, ...] = ()
    joint_reader: tuple[str, ...] = ()  # extra models that read the whole chain's transcript
    group_size = 1  # answers per query it asks for when cfg.group_size is None
    batch_multiplier = 1  # episodes per iteration = this x TrainConfig.batch_size
    saved_state: tuple[str, ...] = ()  # attributes of its own that a checkpoint must keep
    takes_rounds = False  # True: it trains on episodes of several rounds (else refused)
    min_agents = 1  # 2: it needs a chain (no bare method name: the learner alone is impossible)
    shares_policy = False  # True: it can train one policy on every position's turns

    def __init__(self, policies: dict, cfg: LearnerConfig, seed: int = 0,
                 comm: Comm | None = None, structure: Structure | None = None):
        self.cfg = cfg.validate()
        self.structure = structure or type(self).structure
        self.comm = comm or Comm()
        self.policies = dict(policies)  # the rollout's policies (never wrapped)
        self.n_agents = len(self.policies)  # K: the structure's default, or TrainConfig.n_agents
        self.seed = seed
        if self.structure.shared_policy:  # one model: one optimizer, KL controller, statistics
            first = next(iter(policies))
            one = PPOAgent(policies[first], self.agent_config(first), cfg.batch_size,
                           self.sampling, self.comm)
            self.agents = dict.fromkeys(policies, one)
        else:
            self.agents = {name: PPOAgent(p, self.agent_config(name), cfg.batch_size,
                                          self.sampling, self.comm)
                           for name, p in policies.items()}
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def sampling(self) -> SamplingConfig:
        """How this learner's rollouts draw tokens (cfg.sampling by default)."""
        return self.cfg.sampling

    def agent_config(self, agent: str) -> PPOConfig:
        """The PPO settings of one agent (all share cfg.ppo by default), with where kl_coef acts
        filled in (`kl_where` when cfg.ppo.kl.where is None)."""
        kl = self.cfg.ppo.kl
        if self.kl_where_fixed and kl.where not in (None, self.kl_where):
            raise ValueError(f"{self.name} puts the KL in the {self.kl_where}: kl.where="
                             f"{kl.where!r} is not possible (leave it unset)")
        return replace(self.cfg.ppo, kl=replace(kl, where=kl.where or self.kl_where))

    def env_settings(self) -> dict:
        """Env keywords of this learner's structure."""
        return self.structure.env_settings(self.n_agents)

    def attach(self, env) -> None:
        """Called once with the env this learner trains on; nothing by default."""

    @property
    def group(self) -> int:
        """G: answers per query in each batch (cfg.group_size, else the class default)."""
        return self.cfg.group_size or self.group_size

    def credit_span(self, batch: PPOBatch) -> int:
        """The turns of one episode GAE or a return runs across (`credit.credit_span`)."""
        return credit_span(batch.rounds, self.cfg.ppo.credit)

    def reset_options(self, iteration: int) -> dict:
        """Per-iteration env options: the structure's role order, and G answers per query when
        G > 1."""
        return {"rotation": self.structure.rotation(iteration, self.cfg.t_rex, self.n_agents),
                **({"group_size": self.group} if self.group > 1 else {})}

    def update(self, turns: dict[str, Turn], iteration: int) -> dict[str, dict[str, float]]:
        """Learn from one rollout; return per-agent stats."""
        raise NotImplementedError

    def metrics(self, turns: dict[str, Turn], stats: dict) -> dict[str, dict[str, float]]:
        """Per-agent metrics of an iteration (task reward, KL, combined reward, ...; after the
        pioneer, `copy_rate`: how often an answer repeats the previous position's verbatim)."""
        collective = sum(last_round(t.task_reward, t).cpu() for t in turns.values())
        out, coef = {}, report_kl_coef_of(self.cfg)
        for agent, turn in turns.items():
            out[agent] = {**turn_metrics(turn, coef), "collective_reward":
                          float(collective.mean()), **stats.get(agent, {})}
        chain = sorted(turns.values(), key=lambda t: t.position)
        for before, turn in zip(chain, chain[1:]):
            out[turn.agent]["copy_rate"] = copy_rate(before.texts, turn.texts)
        return out

    def extra_models(self) -> dict:
        """The models the learner owns beside the agents' policies (`extra_model_names`)."""
        return {name: getattr(self, name) for name in self.extra_model_names}

    def extra_optimizers(self) -> list:
        """The optimizers of `extra_models` (their state is in `state_dict`)."""
        return []

    def state_dict(self) -> dict:
        """Everything but the weights, for checkpoints.

        Saved automatically: each agent's optimizer, KL controller and score statistics, and
        the learner's RNG. A learner with state of its own (a running baseline, a schedule)
        names those attributes in `saved_state`, and they are saved and restored too (deep
        copies: tensors, numbers, dicts and lists of them); anything richer overrides this
        method and `load_state_dict`, calling super().
        """
        return {"agents": {a: s.state_dict() for a, s in self.agents.items()},
                "generator": self.generator.get_state(),
                "own": {name: copy.deepcopy(getattr(self, name)) for name in self.saved_state}}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict saved."""
        for agent, s in state["agents"].items():
            self.agents[agent].load_state_dict(s)
        self.generator.set_state(state["generator"])
        missing = [n for n in self.saved_state if n not in state.get("own", {})]
        if missing:
            raise ValueError(f"the checkpoint has no {missing} for learner {self.name!r}")
        for name, value in state.get("own", {}).items():
            setattr(self, name, copy.deepcopy(value))


_LEARNERS: dict[str, type[Learner]] = {}  # learner name -> class
_METHODS: dict[str, tuple[str, Structure]] = {}  # method name -> (learner, structure)
_ABLATES: dict[str, str] = {}  # ablation method name -> the mechanism it turns off


def register_learner(name: str):
    """Class decorator: make a Learner available as the learner `name` and, when it can train
    one agent (`min_agents == 1`), as the method `name`: the learner alone, on `single`. A
    bare learner name means that for every learner; `cory-<name>` is registered by the
    learner's module for it on CORY's structure."""

    def add(cls):
        if not (isinstance(cls, type) and issubclass(cls, Learner)):
            raise TypeError(f"register_learner({name!r}) needs a Learner subclass, got {cls!r}")
        if cls.update is Learner.update:
            raise TypeError(f"learner {name!r} ({cls.__qualname__}) has no update(turns, "
                            f"iteration): every learner turns a rollout into updates there "
                            f"(agents/learners/reinforce.py is the worked example)")
        check_not_builtin("learner", name, _LEARNERS, cls, ("agents",))
        cls.name = name
        _LEARNERS[name] = cls
        if cls.min_agents == 1:
            _METHODS[name] = (name, SINGLE)
        return cls

    return add


def register_method(name: str, learner: str, structure: Structure,
                    ablates: str | None = None) -> None:
    """Make `name` a method: the registered `learner` on `structure` (`ablates`: the one
    mechanism it turns off, when it is one of the paper's ablations)."""
    if "/" in name:
        raise ValueError(f"a method name cannot hold '/', got {name!r}")
    _METHODS[name] = (learner, structure)
    if ablates:
        _ABLATES[name] = ablates


@functools.cache
def register_builtin() -> None:
    """Import every module of this package (each registers the learners and methods it
    defines), then the installed `cory.learners` entry points (once)."""
    for module in pkgutil.iter_modules(importlib.import_module(__package__).__path__):
        importlib.import_module(f"{__package__}.{module.name}")
    load_entry_points("cory.learners")


@dataclass(frozen=True)
class Method:
    """A method name resolved: a learner (a Learner class) on a structure."""

    name: str
    learner: type[Learner]
    structure: Structure

    @property
    def n_agents(self) -> int:
        """The default K."""
        return self.structure.n_agents


def resolve_method(name: str) -> Method:
    """The learner and structure of a method name (registered, or `learner/structure`)."""
    register_builtin()
    if not isinstance(name, str):
        raise ValueError(f"method must be a name, got {name!r}")
    if "/" in name:
        learner, _, structure = name.partition("/")
        known = structures()
        if structure not in known:
            raise ValueError(f"unknown structure {structure!r} in method {name!r}; "
                             f"registered structures: {sorted(known)}")
        pair = (learner, known[structure])
    elif name in _METHODS:
        pair = _METHODS[name]
    elif name in _LEARNERS:  # a learner that needs a chain has no bare method name
        with_it = sorted(m for m, (learner, _) in _METHODS.items() if learner == name)
        raise ValueError(f"{name!r} is a learner that needs {_LEARNERS[name].min_agents}+ "
                         f"agents, so it is no method alone: use {', '.join(with_it) or '-'} "
                         f"or {name}/STRUCTURE (structures: {sorted(structures())})")
    else:
        raise ValueError(f"unknown method {name!r}; registered methods: {registered_methods()} "
                         f"(or learner/structure)")
    if pair[0] not in _LEARNERS:
        raise ValueError(f"unknown learner {pair[0]!r} in method {name!r}; registered "
                         f"learners: {sorted(_LEARNERS)}")
    return Method(name, _LEARNERS[pair[0]], pair[1])


def learner_class(name: str) -> type[Learner]:
    """The Learner class of a method name."""
    return resolve_method(name).learner


def registered_methods() -> list[str]:
    """Names of all registered methods."""
    register_builtin()
    return sorted(_METHODS)


def ablation_methods() -> tuple[str, ...]:
    """The registered methods that are the paper's ablations (each registered with the
    mechanism it turns off)."""
    return tuple(m for m in registered_methods() if m in _ABLATES)


def registered_learners() -> list[str]:
    """Names of all registered learners."""
    register_builtin()
    return sorted(_LEARNERS)


def registered_structures() -> list[str]:
    """Names of all registered structures."""
    register_builtin()
    return sorted(structures())
