"""Every model answering alone on held-out queries: task reward, ΣKL and combined reward.

    records = evaluate_alone(trainer, cfg, spec, roles)   # one record per model

Each model of a method answers the test split alone (the single-agent prompt, as PPO's model
does), through the training rollout (`agents.llm.rollout.rollout`), so its summed full KL to the
frozen reference is the one training reports. The queries and the sampler seed are the same at
every evaluation point and for every method of a seed (paired comparisons); sampling uses its
own generator and leaves the training randomness untouched. Exact-match tasks answer each of
`eval_problems` problems `eval_samples` times, which gives pass@1 and pass@k too (and greedy
accuracy at the final point).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from agents.learners.metrics import report_kl_coef_of
from agents.llm.rollout import answer_alone
from agents.training.train import Trainer
from benchmarks.evidence.records import pass_at_k
from benchmarks.settings.config import BenchConfig, RunSpec
from cory_env import BatchedCoryEnv

EVAL_SEED = 10_000  # + the run's seed: the alone-evaluation's sampler


def eval_every(cfg: BenchConfig) -> int:
    """Iterations between alone-evaluations (`cfg.eval_every`, else iterations / 5)."""
    return cfg.eval_every or max(1, cfg.train.iterations // 5)


def evaluation_due(cfg: BenchConfig, iteration: int) -> bool:
    """Whether the models are evaluated alone after `iteration` updates (0: before any)."""
    return iteration % eval_every(cfg) == 0 or iteration == cfg.train.iterations


def _se(x: np.ndarray) -> float:
    """Standard error of a mean."""
    return float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else float("nan")


def evaluate_policy(policy, trainer: Trainer, cfg: BenchConfig, seed: int,
                    final: bool = False) -> dict:
    """One model alone on the test split: reward, ΣKL, combined reward (± standard errors);
    exact-match tasks add pass@1 and pass@k (and greedy accuracy when `final`)."""
    env = BatchedCoryEnv(batch_size=cfg.eval_batch_size, task=trainer.env.task,
                         tokenizer=trainer.env.tokenizer, max_new_tokens=trainer.env.max_new_tokens,
                         split="test", n_agents=1, seed=seed)
    pool = len(env.task.queries("test"))
    exact = trainer.env.task.exact_match
    n = cfg.eval_samples if exact else 1
    problems = list(range(min(cfg.eval_problems if exact else cfg.alone_queries, pool)))
    generator = torch.Generator(device=policy.device).manual_seed(EVAL_SEED + seed)
    sampling = trainer.cfg.sampling  # the shared setting, the same for every method
    reward, kl = answer_alone(env, policy, sampling, generator, [p for p in problems
                                                                 for _ in range(n)])
    coef = report_kl_coef_of(trainer.cfg)
    combined = reward - coef * kl
    out = {"n_queries": len(problems), "n_samples": n,
           "task_reward": float(reward.mean()), "task_reward_se": _se(reward),
           "kl": float(kl.mean()), "kl_se": _se(kl), "report_kl_coef": coef,
           "combined_reward": float(combined.mean()), "combined_reward_se": _se(combined)}
    if exact:
        k = cfg.pass_k
        correct = (reward.reshape(len(problems), n) > 0.5).sum(1)
        out.update({"k": k, "pass@1": float(np.mean([pass_at_k(n, int(c), 1) for c in correct])),
                    "pass@k": float(np.mean([pass_at_k(n, int(c), k) for c in correct]))})
        if final:
            greedy = dataclasses.replace(sampling, top_k=1)
            solved, _ = answer_alone(env, policy, greedy, generator, problems, kl=False)
            out["greedy"] = float(np.mean(solved > 0.5))
    return out


def evaluate_alone(trainer: Trainer, cfg: BenchConfig, spec: RunSpec,
                   roles: dict | None = None, final: bool = False) -> list[dict]:
    """Alone-evaluation records of every model of a trainer at its current iteration
    (`roles`: the role each model held in the last training iteration). A policy that plays
    several agents (`cory-shared`) is evaluated once; each of its agents gets the record."""
    roles = roles or {}
    out, done = [], {}
    with torch.random.fork_rng(devices=[]):  # evaluation never touches training randomness
        for name, policy in sorted(trainer.learner.policies.items()):
            if id(policy) not in done:
                done[id(policy)] = evaluate_policy(policy, trainer, cfg, spec.seed, final)
            out.append({**spec.ids(), "iteration": trainer.iteration, "agent": name,
                        "role": roles.get(name), "final": final, **done[id(policy)]})
    return out
