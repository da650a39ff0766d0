"""The training loop: build the env, the policies and a learner; iterate rollout -> update.

    from agents.training.config import TrainConfig
    from agents.training.train import Trainer
    trainer = Trainer(TrainConfig(task="sentiment", method="cory", model="path/to/lm"))
    for metrics in trainer.run():
        print(metrics["llm_0"]["task_reward"])

A method is a learner on a structure (`agents.learners.registry.resolve_method`): a registered name
(`registered_methods()`) or `learner/structure`. Its settings are a TrainConfig
(`agents.training.config`).
"""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from contextlib import contextmanager

import torch

from cory_common.pretrained import load_tokenizer, resolve_model
from cory_env import BatchedCoryEnv, make_task, offline_model
from cory_env.chain import agent_names

from ..learners.comm import Comm
from ..learners.registry import resolve_method
from ..llm.engine import attach, decodes_fast
from ..llm.loading import config_positions
from ..llm.policy import LLMPolicy
from ..llm.rollout import rollout
from ..refmodels import reference_lm
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig, check_device, more_samples, tokenizer_folder


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
    recipe = offline_model(task)
    if recipe is None:
        name = task if isinstance(task, str) else getattr(task, "name", task)
        raise ValueError(f"task {name!r} has no offline reference LM: give a model (--model)")
    return str(reference_lm(recipe))


def model_of(cfg: TrainConfig, agent: str) -> str | None:
    """The model an agent starts from: models[agent], else model (None: the offline LM); a
    short name or a GGUF file as its converted local folder."""
    return resolve_model(cfg.models.get(agent, cfg.model))


def check_tokenizers(cfg: TrainConfig, agents: list[str], task) -> None:
    """A ValueError naming both sides when an agent's model folder holds a tokenizer other
    than the one the env builds prompts with (llm_0's folder's, else the task's): each agent
    reads the others' token ids, so they must share one."""
    folders = {a: tokenizer_folder(model_of(cfg, a)) for a in agents}
    if not any(folders[a] for a in agents[1:]):
        return  # every agent reads the env's tokenizer

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
    """Warn, naming the numbers, when a chain's longest sequence (the whole transcript of every
    turn for the `joint` models, e.g. MAPPO's critic) can exceed what a model's position
    embeddings reach."""
    ep = env.episodes
    if ep.n_turns <= 2:
        return
    for name, policy in policies.items():
        config = policy.hf_model.config
        limit = config_positions(config)
        need = ep.L + (ep.n_turns - 1) * ep.T if name in joint else ep.L
        if limit and need > limit:
            chain = f"{ep.n_agents} agents" + (f" over {ep.rounds} rounds" if ep.rounds > 1
                                               else "")
            warnings.warn(f"{name}'s model reads at most {limit} positions, but a chain of "
                          f"{chain} can need {need} tokens (context {ep.L}, {ep.T} per "
                          f"answer): use fewer agents or rounds, a smaller max_new_tokens, or "
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
    for a in agents:  # the models that decode
        policies[a].decode_path = attach(policies[a], cfg.decode)
    return policies


class Trainer:
    """Rollout -> update iterations of one method on one task, deterministic under cfg.seed."""

    def __init__(self, cfg: TrainConfig, env_options: dict | None = None,
                 comm: Comm | None = None):
        self.cfg = cfg = cfg.validate()  # the run's config: derived fields filled in
        check_device("device", cfg.device, present=True)  # here, before any model loads
        for agent, dev in cfg.placement.items():
            check_device(f"placement[{agent!r}]", dev, present=True)
        self.method = resolve_method(cfg.method)
        self.learner_cls = self.method.learner
        if self.learner_cls.batch_multiplier > 1:
            self.cfg = cfg = more_samples(cfg, self.learner_cls.batch_multiplier)
        agents = list(agent_names(cfg.agents_count()))
        tokenizer, task = self._tokenizer(), self._task()
        check_tokenizers(cfg, agents, task)
        names = self.learner_cls.extra_model_names
        shared = self.method.structure.shared_policy  # one model plays every position
        policies = build_policies(cfg, agents[:1] if shared else agents, names)
        extra = {name: policies.pop(name) for name in names}
        if shared:
            policies = dict.fromkeys(agents, policies[agents[0]])
        self.learner = self.learner_cls(policies, cfg.learner_part(), seed=cfg.seed, comm=comm,
                                        structure=self.method.structure, **extra)
        self.env = BatchedCoryEnv(batch_size=cfg.batch_size, task=task,
                                  tokenizer=tokenizer, max_new_tokens=cfg.max_new_tokens,
                                  rounds=cfg.rounds, seed=cfg.seed, **self.learner.env_settings(),
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
        for policy in {id(p): p for p in self.learner.policies.values()}.values():
            if decodes_fast(policy):  # folded again at the next decode
                policy.engine.release()
        with oom_guard(self.cfg, "update"):
            stats = self.learner.update(turns, self.iteration)
        metrics = self.learner.metrics(turns, stats)
        metrics["iteration"] = self.iteration
        metrics["rotation"] = self.env.rotation  # the env's, reduced where it entered
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
        save_checkpoint(self, path)

    def load(self, path: str) -> None:
        """Continue from a checkpoint written by save()."""
        load_checkpoint(self, path)
