"""Test-split evaluation of exact-match tasks: pass@1, pass@k and greedy accuracy.

    records = evaluate_models(trainer, cfg, spec)    # one record per model of the trainer

Sampling uses its own generator and leaves the training randomness untouched.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from agents.rollout import play_turn
from agents.sampling import SamplingConfig
from agents.train import Trainer
from cory_env import BatchedCoryEnv

from .config import BenchConfig, RunSpec
from .records import pass_at_k

EVAL_TASKS = ("arithmetic", "gsm8k")  # exact-match rewards: reward 1 = solved


@torch.inference_mode()
def sample_rewards(env: BatchedCoryEnv, policy, sampling: SamplingConfig,
                   generator: torch.Generator, queries: list[int]) -> np.ndarray:
    """One answer per query index from a policy alone (single-agent env); their task rewards.

    A list shorter than the env's batch is padded with its last query (answers dropped)."""
    n = len(queries)
    env.reset(options={"queries": list(queries) + [queries[-1]] * (env.batch_size - n)})
    play_turn(env, policy, sampling, generator)
    return env.infos()[env.agents[0]]["task_reward"].numpy()[:n]


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
            "pass@1": float(np.mean([pass_at_k(n, int(c), 1) for c in correct])),
            "pass@k": float(np.mean([pass_at_k(n, int(c), k) for c in correct])),
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
    ids = {**spec.ids(), "method": "base", "sweep_eta": None, "run": spec.base_key} \
        if base else spec.ids()
    out = []
    with torch.random.fork_rng(devices=[]):  # evaluation never touches training randomness
        for name, policy in chosen.items():
            out.append({**ids, "model": name, **evaluate_policy(policy, trainer, cfg,
                                                                spec.seed)})
    return out


def wants_eval(cfg: BenchConfig, task: str) -> bool:
    """Whether a task gets the test-split pass@k evaluation."""
    return cfg.eval_problems > 0 and task in EVAL_TASKS

