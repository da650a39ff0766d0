"""Learners: the swappable algorithms that turn rollouts into updates.

A learner owns one `PPOAgent` (policy + optimizer + KL controller + score statistics) per LLM,
declares the env structure it trains on (class attributes `knowledge_transfer`, `reward_mode`,
`role_exchange`; `n_agents`; `extra_model_names`), says which roles to play each iteration
(`reset_options`), and updates from the finished turns (`update`). To add an algorithm,
subclass `Learner` in one file and decorate it with `@register_learner("name")`;
`agents/learners/reinforce.py` is the worked example, and `agents/learners/cory.py` is CORY.

Multi-process training reaches a learner only through `self.comm` (`agents.learners.comm.Comm`): its
agents call it to prepare their models, back-propagate, and agree on statistics across ranks.
"""

from __future__ import annotations

import copy
import functools
import importlib
from dataclasses import dataclass, field, replace

import torch

from cory_env.checks import check_int
from cory_env.config import check_fields
from cory_env.plugins import check_not_builtin, load_entry_points

from ..llm.rollout import Turn
from ..llm.sampling import SamplingConfig
from .comm import Comm
from .metrics import turn_metrics
from .ppo import (
    PPOBatch,
    PPOConfig,
    kl_per_token,
    masked_mean,
    masked_var,
    ppo_update,
    prepare_advantages,
)
from .shaping import RunningMoments, make_kl_controller, scale_scores, token_rewards


@dataclass
class LearnerConfig:
    """What a learner needs besides its policies: PPO settings, sampling and CORY's structure."""

    ppo: PPOConfig = field(default_factory=PPOConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    t_rex: int = 5  # role-exchange period, for learners that exchange roles
    eta: float | None = None  # weight of KL in the combined reward; None -> current beta
    group_size: int | None = None  # answers per query (None: the learner's own default)
    per_agent_norm: bool = True  # normalise advantages per agent, not over both (Dr. MAS)
    group_kl_in: str = "loss"  # where the GRPO family puts the KL: "loss" (k3) or "reward"

    def validate(self) -> LearnerConfig:
        """Raise ValueError naming the bad field."""
        check_fields(self)
        check_int("t_rex", self.t_rex, 1)
        check_int("group_size", self.group_size, 1, none_ok=True)
        if not isinstance(self.per_agent_norm, bool):
            raise ValueError(f"per_agent_norm must be True or False, got {self.per_agent_norm!r}")
        if self.group_kl_in not in ("loss", "reward"):
            raise ValueError(f"group_kl_in must be 'loss' or 'reward', got {self.group_kl_in!r}")
        self.ppo.validate()
        return self


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

    def __init__(self, policy, cfg: PPOConfig, sampling: SamplingConfig | None = None,
                 comm: Comm | None = None):
        self.comm = comm or Comm()
        self.policy, self.cfg, self.sampling = self.comm.prepare(policy), cfg, sampling
        self.optimizer = adam(self.policy.trainable_parameters(), cfg.lr)
        self.kl_ctl = make_kl_controller(cfg)
        self.score_stats = RunningMoments()

    @property
    def beta(self) -> float:
        """The current KL coefficient."""
        return float(self.kl_ctl.value)

    def penalty(self, turn: Turn) -> torch.Tensor:
        """The per-token KL estimate chosen by cfg.kl_penalty, masked."""
        if self.cfg.kl_penalty == "full":
            return turn.full_kl
        return kl_per_token(turn.raw_logprobs, turn.ref_logprobs, self.cfg.kl_penalty) \
            * turn.response_mask

    def batch(self, turn: Turn, scores: torch.Tensor | None = None) -> PPOBatch:
        """Shape a turn into a PPO batch: -beta*KL per token plus the score on the last one."""
        if self.recomputes:
            turn = self.recompute(turn)
        scores = scale_scores(turn.reward if scores is None else scores, self.score_stats,
                              self.cfg, gather=self.comm.gather)
        beta = self.beta if self.cfg.kl_in == "reward" else 0.0
        rewards = token_rewards(scores, self.penalty(turn), turn.response_mask, beta)
        return PPOBatch(input_ids=turn.input_ids, attention_mask=turn.attention_mask,
                        response_mask=turn.response_mask, old_logprobs=turn.logprobs,
                        old_values=turn.values, ref_logprobs=turn.ref_logprobs, rewards=rewards,
                        scores=scores)

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

    def learn(self, batch: PPOBatch, turn: Turn, generator) -> dict[str, float]:
        """Run PPO on the batch, then update beta from this batch's KL."""
        stats = ppo_update(self.policy, self.optimizer, batch, self.cfg, generator=generator,
                           kl_coef=self.beta, evaluate_kwargs={"sampling": self.sampling},
                           backward=self.comm.backward, all_ok=self.comm.all_ok)
        stats["beta"] = self.beta
        kl = self.comm.mean(float(self.penalty(turn).sum(1).mean()))
        self.kl_ctl.update(kl, len(batch) * self.comm.world_size)
        return stats

    def state_dict(self) -> dict:
        """Optimizer, KL controller and score statistics (weights are saved by the policy)."""
        return {"optimizer": self.optimizer.state_dict(), "kl_ctl": self.kl_ctl.state_dict(),
                "score_stats": self.score_stats.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict saved."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.kl_ctl.load_state_dict(state["kl_ctl"])
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


class Learner:
    """Base learner: one PPOAgent per LLM; subclasses override `update` (and maybe more).

    The class attributes are the env structure it trains on. The base is two independent
    agents: no knowledge transfer, each its own reward, fixed roles
    (`agents.learners.cory.CoryStructure`
    turns on CORY's three mechanisms).
    """

    name = "base"
    n_agents = 2  # the default K (1 for single-agent learners); TrainConfig.n_agents sets K
    knowledge_transfer = False  # the observer sees the pioneer's answer
    reward_mode = "individual"  # "collective" (r_pio + r_obs to both) or "individual"
    role_exchange = False  # swap pioneer and observer every t_rex iterations
    # Models the learner owns beside the agents' policies, by name: the Trainer builds each
    # (on the first agent's model, no reference) and passes it as a keyword; checkpoints,
    # placement and the distributed trainer read them through `extra_models`.
    extra_model_names: tuple[str, ...] = ()
    joint_reader: tuple[str, ...] = ()  # extra models that read the whole chain's transcript
    group_size = 1  # answers per query it asks for when cfg.group_size is None
    batch_multiplier = 1  # episodes per iteration = this x TrainConfig.batch_size
    saved_state: tuple[str, ...] = ()  # attributes of its own that a checkpoint must keep

    def __init__(self, policies: dict, cfg: LearnerConfig, seed: int = 0,
                 comm: Comm | None = None):
        self.cfg = cfg.validate()
        self.comm = comm or Comm()
        self.policies = dict(policies)  # the rollout's policies (never wrapped)
        self.n_agents = len(self.policies)  # K: the class default, or the Trainer's n_agents
        self.seed = seed
        self.agents = {name: PPOAgent(p, self.agent_config(name), self.sampling, self.comm)
                       for name, p in policies.items()}
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def sampling(self) -> SamplingConfig:
        """How this learner's rollouts draw tokens (cfg.sampling by default)."""
        return self.cfg.sampling

    def agent_config(self, agent: str) -> PPOConfig:
        """The PPO settings of one agent (all share cfg.ppo by default)."""
        return replace(self.cfg.ppo)

    def env_settings(self) -> dict:
        """Env keywords this learner needs (structure flags of CORY)."""
        return {"knowledge_transfer": self.knowledge_transfer, "reward_mode": self.reward_mode,
                "single_agent": self.n_agents == 1, "n_agents": max(self.n_agents, 2)}

    def attach(self, env) -> None:
        """Called once with the env this learner trains on; nothing by default."""

    @property
    def group(self) -> int:
        """G: answers per query in each batch (cfg.group_size, else the class default)."""
        return self.cfg.group_size or self.group_size

    def reset_options(self, iteration: int) -> dict:
        """Per-iteration env options: fixed roles (rotation 0; `agents.learners.cory` rotates
        them), and G answers per query when G > 1."""
        return {"rotation": 0,
                **({"group_size": self.group} if self.group > 1 else {})}

    def update(self, turns: dict[str, Turn], iteration: int) -> dict[str, dict[str, float]]:
        """Learn from one rollout; return per-agent stats."""
        raise NotImplementedError

    def metrics(self, turns: dict[str, Turn], stats: dict) -> dict[str, dict[str, float]]:
        """Per-agent metrics of an iteration (task reward, KL, combined reward, ...)."""
        collective = sum(t.task_reward.cpu() for t in turns.values())  # agents' devices differ
        out = {}
        for agent, turn in turns.items():
            beta = self.agents[agent].beta if agent in self.agents else 0.0
            eta = beta if self.cfg.eta is None else self.cfg.eta
            out[agent] = {**turn_metrics(turn, eta), "collective_reward":
                          float(collective.mean()), **stats.get(agent, {})}
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


_LEARNERS: dict[str, type[Learner]] = {}


def register_learner(name: str):
    """Class decorator: make a Learner available by name (CLI, benchmarks)."""

    def add(cls):
        if not (isinstance(cls, type) and issubclass(cls, Learner)):
            raise TypeError(f"register_learner({name!r}) needs a Learner subclass, got {cls!r}")
        check_not_builtin("learner", name, _LEARNERS, cls, ("agents",))
        cls.name = name
        _LEARNERS[name] = cls
        return cls

    return add


# The modules that register the built-in learners, listed explicitly (a new one goes here).
BUILTIN = ("base", "cory", "arms", "grpo", "dr_grpo", "rloo", "reinforce", "reinforce_pp",
           "mappo")


@functools.cache
def _register_builtin() -> None:
    """Import the BUILTIN learner modules, then the installed `cory.learners` entry points
    (once)."""
    for module in BUILTIN:
        importlib.import_module(f"{__package__}.{module}")
    load_entry_points("cory.learners")


def learner_class(name: str) -> type[Learner]:
    """The Learner class registered under name."""
    _register_builtin()
    if name not in _LEARNERS:
        raise ValueError(f"unknown method {name!r}; registered learners: {sorted(_LEARNERS)}")
    return _LEARNERS[name]


def registered_learners() -> list[str]:
    """Names of all registered learners."""
    _register_builtin()
    return sorted(_LEARNERS)


@register_learner("ippo")
class IPPO(Learner):
    """Independent PPO: each LLM learns from its own turn with its own critic."""

    def update(self, turns, iteration):
        """PPO on each agent's own turn (advantages whitened per agent, or jointly)."""
        batches = {a: self.agents[a].batch(t) for a, t in turns.items()}
        cfg = self.cfg.ppo
        if not self.cfg.per_agent_norm and len(batches) > 1 and cfg.whiten_advantages:
            raw = replace(cfg, whiten_advantages=False)
            for b in batches.values():
                prepare_advantages(b, raw)
            white = joint_whiten([b.advantages for b in batches.values()],
                                 [b.response_mask for b in batches.values()])
            for b, w in zip(batches.values(), white):
                b.advantages = w
        return {a: self.agents[a].learn(b, turns[a], self.generator) for a, b in batches.items()}


@register_learner("ppo")
class PPO(IPPO):
    """The single-agent baseline: one LLM, no observer, its own reward."""

    n_agents = 1
