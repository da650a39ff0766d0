"""The learner interface: how a training algorithm turns rollouts into updates.

A learner owns one `PPOAgent` (`agents.learners.ppo_agent`: policy, optimizer, KL controller
and score statistics) per LLM, runs on a `Structure` (`agents.learners.structure`: the env's
agent count, knowledge transfer, reward mode and role schedule), says which roles to play each
iteration (`reset_options`), and updates from the finished turns (`update`). To add a learner,
subclass `Learner` in one file and decorate it with `@register_learner("name")`
(`agents.learners.registry`); `agents/learners/reinforce.py` is the worked example, and
`agents/learners/cory.py` is CORY.

Multi-process training reaches a learner only through `self.comm` (`agents.learners.comm.Comm`):
its agents call it to prepare their models, back-propagate, and agree on statistics across ranks.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, fields, replace

import torch

from cory_common.checks import check_fields, check_int, meta
from cory_env.chain import copy_rate

from ..llm.rollout import Turn
from ..llm.sampling import SamplingConfig
from .comm import Comm
from .credit import credit_span
from .metrics import last_round, report_kl_coef_of, turn_metrics
from .ppo import (
    PPOBatch,
    masked_mean,
    masked_var,
)
from .ppo_agent import PPOAgent
from .ppo_config import PPOConfig
from .structure import INDEPENDENT, Structure


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

