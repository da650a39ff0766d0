"""The training loop: build the env, the policies and a learner; iterate rollout -> update.

    from agents.train import TrainConfig, Trainer
    trainer = Trainer(TrainConfig(task="sentiment", method="cory", model="path/to/lm"))
    for metrics in trainer.run():
        print(metrics["llm_0"]["task_reward"])

Methods are presets of (learner, CORY structure flags); any registered learner is a method too.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field

import torch

from cory_env import BatchedCoryEnv

from . import mappo, reinforce  # noqa: F401  (register their learners)
from .learner import LearnerConfig, learner_class, registered_learners
from .policy import LLMPolicy, LoraSettings, SamplingConfig
from .ppo import PPOConfig
from .rollout import rollout

CORY_FLAGS = {"knowledge_transfer": True, "reward_mode": "collective", "role_exchange": True}
METHODS = {
    "ppo": ("ppo", {}),
    "cory": ("ippo", CORY_FLAGS),
    "ippo": ("ippo", {"knowledge_transfer": False, "reward_mode": "individual",
                      "role_exchange": False}),
    "mappo": ("mappo", CORY_FLAGS),
    "cory-no-kt": ("ippo", {**CORY_FLAGS, "knowledge_transfer": False}),
    "cory-no-re": ("ippo", {**CORY_FLAGS, "role_exchange": False}),
    "cory-individual": ("ippo", {**CORY_FLAGS, "reward_mode": "individual"}),
}


def method_spec(method: str) -> tuple[str, dict]:
    """(learner name, structure flags) of a method; a bare learner name gets CORY's flags."""
    if method in METHODS:
        return METHODS[method]
    if method in registered_learners():
        return method, CORY_FLAGS
    raise ValueError(f"unknown method {method!r}; known: {known_methods()}")


def known_methods() -> list[str]:
    """Every method name: the presets plus registered learners."""
    return sorted(set(METHODS) | set(registered_learners()))


@dataclass
class TrainConfig:
    """One training run: task, method, model and every hyperparameter."""

    task: str = "sentiment"
    method: str = "cory"
    model: str | None = None  # HF name or local path; None -> the offline task's reference LM
    iterations: int = 20
    batch_size: int = 32
    max_new_tokens: int | None = None
    seed: int = 0
    device: str = "cpu"
    t_rex: int = 5
    eta: float | None = None
    lora: LoraSettings | None = None
    load_in_4bit: bool = False
    shared_base: bool = True  # with LoRA: both agents are adapters on one base
    placement: dict[str, str] = field(default_factory=dict)  # e.g. {"llm_1": "cuda:1"}
    task_options: dict = field(default_factory=dict)
    ppo: PPOConfig = field(default_factory=lambda: PPOConfig(batch_size=32, mini_batch_size=8))
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def validate(self) -> TrainConfig:
        """Check the config before any model is loaded, naming the bad field."""
        method_spec(self.method)
        for name in ("iterations", "batch_size", "t_rex"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.ppo.batch_size != self.batch_size:
            self.ppo = dataclasses.replace(self.ppo, batch_size=self.batch_size)
        self.ppo.validate()
        if self.load_in_4bit and self.lora is None:
            raise ValueError("load_in_4bit=True needs LoRA (set lora)")
        for agent, dev in self.placement.items():
            if agent not in ("llm_0", "llm_1", "critic"):
                raise ValueError(f"placement key {agent!r} must be llm_0, llm_1 or critic")
            torch.device(dev)
        return self


def default_model(task: str) -> str:
    """The offline task's reference LM folder (built and cached on first use)."""
    from cory_env.offline.lm import reference_lm

    return str(reference_lm(task))


def build_policies(cfg: TrainConfig, agents: list[str], critic: bool = False) -> dict:
    """One policy per agent (plus "critic" if asked); a frozen reference is shared."""
    model = cfg.model or default_model(cfg.task)
    torch.manual_seed(cfg.seed)
    where = {a: cfg.placement.get(a, cfg.device) for a in [*agents, "critic"]}
    kw = {"load_in_4bit": cfg.load_in_4bit}
    if cfg.lora is not None and cfg.shared_base and len(agents) == 2:
        pair = LLMPolicy.shared_lora_pair(model, cfg.lora, names=tuple(agents),
                                          device=where[agents[0]], **kw)
        policies = dict(zip(agents, pair))
    elif cfg.lora is not None:
        policies = {a: LLMPolicy.from_pretrained(model, lora=cfg.lora, device=where[a],
                                                 adapter_name=a, **kw) for a in agents}
    else:
        first = LLMPolicy.from_pretrained(model, reference="copy", device=where[agents[0]])
        policies = {agents[0]: first}
        for a in agents[1:]:
            lm = copy.deepcopy(first.model).to(where[a])
            ref = first.ref_model if where[a] == where[agents[0]] else \
                copy.deepcopy(first.ref_model).to(where[a])
            policies[a] = LLMPolicy(lm, reference=ref)
            policies[a].value_head.load_state_dict(first.value_head.state_dict())
    if critic:
        policies["critic"] = LLMPolicy.from_pretrained(model, reference=None,
                                                       device=where["critic"])
    return policies


class Trainer:
    """Rollout -> update iterations of one method on one task, deterministic under cfg.seed."""

    def __init__(self, cfg: TrainConfig, env_options: dict | None = None):
        self.cfg = cfg.validate()
        name, flags = method_spec(cfg.method)
        self.learner_cls = learner_class(name)
        lcfg = LearnerConfig(ppo=cfg.ppo, sampling=cfg.sampling, t_rex=cfg.t_rex, eta=cfg.eta,
                             **flags)
        agents = ["llm_0"] if self.learner_cls.n_agents == 1 else ["llm_0", "llm_1"]
        policies = build_policies(cfg, agents, critic=name == "mappo")
        critic = policies.pop("critic", None)
        extra = {"critic": critic} if critic is not None else {}
        self.learner = self.learner_cls(policies, lcfg, seed=cfg.seed, **extra)
        tokenizer = self._tokenizer()
        self.env = BatchedCoryEnv(batch_size=cfg.batch_size, task=self._task(),
                                  tokenizer=tokenizer, max_new_tokens=cfg.max_new_tokens,
                                  seed=cfg.seed, **self.learner.env_settings(),
                                  **(env_options or {}))
        self.iteration = 0

    def _task(self):
        from cory_env import make_task

        return make_task(self.cfg.task, **self.cfg.task_options)

    def _tokenizer(self):
        """The model folder's tokenizer when it has one, else the task's."""
        import os

        model = self.cfg.model
        if model and os.path.isdir(model) and any(
                f.startswith("tokenizer") for f in os.listdir(model)):
            return model
        return None

    def step(self) -> dict:
        """One iteration: rollout with the scheduled roles, update, metrics."""
        t0 = time.perf_counter()
        options = self.learner.reset_options(self.iteration)
        turns = rollout(self.env, self.learner.policies, self.cfg.sampling,
                        self.learner.generator, reset_options=options)
        t1 = time.perf_counter()
        stats = self.learner.update(turns, self.iteration)
        metrics = self.learner.metrics(turns, stats)
        metrics["iteration"] = self.iteration
        metrics["swap_roles"] = bool(options.get("swap_roles", False))
        metrics["time_rollout_s"], metrics["time_update_s"] = t1 - t0, time.perf_counter() - t1
        self.iteration += 1
        return metrics

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
