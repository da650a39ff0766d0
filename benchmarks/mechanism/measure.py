"""Does a model have CORY's mechanism? Knowledge transfer and cross-role transfer, measured.

    result = measure_transfer("sentiment")          # also written to <model>/transfer.json
    print(format_transfer(result))

* **Knowledge transfer** (no RL): the untrained model as observer, on held-out queries, with
  (a) the full observer prompt and the pioneer's sampled answer, (b) the same instruction with
  an empty answer (the pioneer's turn forced to EOS), (c) the plain prompt. (a) − (b) is what
  the answer is worth, (b) − (c) what the instruction is worth. `checkpoint_knowledge_transfer`
  measures the same split for trained models (a learner's checkpoints, one per seed), with the
  partner the observer trained beside as the pioneer.
* **Cross-role transfer**: at the benchmark's default budget and settings, train PPO, and CORY
  without role exchange (`cory-no-re`: llm_0 always the pioneer, llm_1 always the observer),
  or read such runs' checkpoints (`checkpoint_cross_role`: a study's own models). Then every
  model answers held-out queries alone:
  (r_alone(observer-only model) − r_alone(base)) / (r_alone(PPO model) − r_alone(base)) is the
  share of the skill learnt as observer that carries over to answering alone. The reverse is
  (r_obs(pioneer-only model) − r_obs(base)) / (r_obs(observer-only model) − r_obs(base)), each
  as observer of the base model's answers.

Gains are means over seeds with 95% t intervals; a transfer is the ratio of the mean gains
with Fieller's 95% interval, unbounded when the denominator's own interval contains 0
(`benchmarks.evidence.intervals`). The verdict reads the interval, never the point: *present*
when it lies at or above PRESENT, *absent* below WEAK, *weak* inside (0, PRESENT), *undefined* when
PPO's gain is not clear of 0 (nothing to carry) and *inconclusive* otherwise; the summaries,
verdict, report lines and merge of saved measurements are `benchmarks.evidence.transfer`. Episodes
are played through the one decode loop (`agents.llm.rollout`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

import cory_env
from agents.learners.registry import resolve_method
from agents.llm.rollout import answer_alone
from agents.llm.sampling import SamplingConfig
from agents.refmodels.measure import as_policy, forced_tokens, play_episode
from agents.training.checkpoint import read_checkpoint
from agents.training.config import TrainConfig, tokenizer_folder
from agents.training.restore import load_agents, run_tokenizer, saved_config
from agents.training.train import Trainer, build_policies, default_model, model_of
from benchmarks.evidence.transfer import (
    cross_role_summary,
    kt_summary,
    summarize,
    training_budget,
    transfer_file,
)
from cory_common.files import atomic_write
from cory_env import make_task

SEEDS = (0, 1, 2)
QUERIES = 128  # held-out queries per measurement
EVAL_SEED = 20_000


def _env(task, tokenizer, max_new, n: int, **kw):
    """A test-split env of n episodes for the measurements."""
    return cory_env.BatchedCoryEnv(batch_size=n, task=task, tokenizer=tokenizer,
                                   max_new_tokens=max_new, split="test", **kw)


def held_out(env, n: int) -> list[int]:
    """n query indices of the env's split, cycling when it holds fewer (every answer is
    sampled, so a repeated query is another draw, as a benchmark's eval_samples)."""
    pool = len(env.task.queries(env.config.split))
    return [i % pool for i in range(n)]


def observer_rewards(env, pioneer, observer, generator, queries, empty_answer=False) -> np.ndarray:
    """The observer's task rewards with `pioneer` answering first (or an empty answer)."""
    forced = forced_tokens([[]] * env.batch_size, env.max_new_tokens, env.episodes.eos) \
        if empty_answer else None
    return play_episode(pioneer, env, queries, generator, forced, observer)["observer"]["rewards"]


def _generator(policy, seed: int) -> torch.Generator:
    """The measurements' sampler for one seed, on the policy's device."""
    return torch.Generator(device=policy.device).manual_seed(EVAL_SEED + seed)


def knowledge_transfer(policy, task, tokenizer=None, max_new_tokens=None, seeds=SEEDS,
                       n: int = QUERIES, pioneer=None) -> dict:
    """A model as observer: full prompt vs empty answer vs plain prompt, per seed (the
    pioneer's sampled answers: `pioneer`'s, else the model's own)."""
    return kt_summary([_kt_row(policy, pioneer or policy, task, tokenizer, max_new_tokens, s, n)
                        for s in seeds])


def _kt_row(observer, pioneer, task, tokenizer, max_new_tokens, seed: int, n: int) -> dict:
    """One seed's observer rewards under the three prompts."""
    kt = _env(task, tokenizer, max_new_tokens, n)
    no_kt = _env(task, tokenizer, max_new_tokens, n, knowledge_transfer=False)
    queries = held_out(kt, n)
    with torch.random.fork_rng(devices=[]):
        return {"full": float(observer_rewards(kt, pioneer, observer,
                                               _generator(observer, seed), queries).mean()),
                "empty_answer": float(observer_rewards(kt, pioneer, observer,
                                                       _generator(observer, seed), queries,
                                                       empty_answer=True).mean()),
                "plain": float(observer_rewards(no_kt, pioneer, observer,
                                                _generator(observer, seed), queries).mean())}


def checkpoint_knowledge_transfer(paths: list[str], observer: str = "llm_1",
                                  pioneer: str = "llm_0", n: int = QUERIES) -> dict:
    """The knowledge-transfer split of trained models: for each checkpoint (a seed), its
    `observer` agent reads its `pioneer` agent's answers under the three prompts; intervals are
    over the checkpoints (measured with sampler seed i for the i-th)."""
    rows = []
    for i, path in enumerate(paths):
        cfg, policies, state = load_agents(path, sorted({pioneer, observer}))
        task = make_task(cfg.task, **cfg.task_options)
        row = _kt_row(policies[observer], policies[pioneer], task,
                      tokenizer_folder(model_of(cfg, "llm_0")), cfg.max_new_tokens, i, n)
        rows.append({"checkpoint": str(path), "iteration": int(state["iteration"]), **row})
    out = kt_summary(rows)
    out.update(checkpoints=[r["checkpoint"] for r in rows], observer=observer, pioneer=pioneer,
               queries=n, iterations=[r["iteration"] for r in rows])
    return out


def _alone(policy, env, seed: int, n: int) -> float:
    """Mean task reward of a policy answering n held-out queries alone (fixed sampler seed)."""
    with torch.random.fork_rng(devices=[]):
        rewards, _ = answer_alone(env, policy, SamplingConfig(), _generator(policy, seed),
                                  held_out(env, n), kl=False)
    return float(rewards.mean())


def _as_observer(policy, base, env, seed: int, n: int) -> float:
    """Mean observer reward of a policy given the base model's answers (fixed seed)."""
    with torch.random.fork_rng(devices=[]):
        return float(observer_rewards(env, base, policy, _generator(policy, seed),
                                      held_out(env, n)).mean())


def cross_role_transfer(cfg: TrainConfig, seeds=SEEDS, n: int = QUERIES,
                        progress=print) -> dict:
    """Train PPO and cory-no-re per seed at `cfg`'s budget; the transfer ratios and the
    alone / observer rewards behind them."""
    rows = []
    for s in seeds:
        ppo = Trainer(replace(cfg, method="ppo", seed=s))
        envs = _cross_envs(ppo.env.task, ppo.env.tokenizer, ppo.env.max_new_tokens, n)
        base = ppo.learner.policies["llm_0"]
        row = _base_row(s, base, _frozen_copy(base), envs, n)
        for _ in ppo.run():
            pass
        row["alone_ppo"] = _alone(ppo.learner.policies["llm_0"], envs[0], s, n)
        del ppo
        cory = Trainer(replace(cfg, method="cory-no-re", seed=s))
        for _ in cory.run():
            pass
        rows.append(_trained_row(row, cory.learner.policies, _frozen_copy(base), envs, n))
        progress(_row_text(rows[-1]))
    return {"per_seed": rows, **cross_role_summary(rows)}


def checkpoint_cross_role(ppo: list[str], observer_only: list[str], n: int = QUERIES,
                          progress=print) -> tuple[TrainConfig, dict]:
    """`cross_role_transfer` on models already trained: PPO checkpoints and cory-no-re
    checkpoints (llm_0 always pioneer, llm_1 always observer; a benchmark's ckpt/), paired by
    their seed, each the end of a run at one budget. Returns the PPO runs' TrainConfig and the
    same figures; the seeds' sampler seeds are the ones `cross_role_transfer` uses."""
    pairs = _pair_by_seed(ppo, observer_only)
    rows, first = [], None
    for s, (p_path, c_path) in sorted(pairs.items()):
        cfg, ppo_agents, _ = load_agents(p_path, ["llm_0"])
        _, cory_agents, _ = load_agents(c_path, ["llm_0", "llm_1"])
        first = first or cfg
        task = make_task(cfg.task, **cfg.task_options)
        tokenizer = run_tokenizer(cfg, task)
        envs = _cross_envs(task, tokenizer, cfg.max_new_tokens or task.default_max_new_tokens, n)
        base = build_policies(cfg, ["llm_0"])["llm_0"]  # untrained, as before training
        row = _base_row(s, base, _frozen_copy(base), envs, n)
        row["alone_ppo"] = _alone(ppo_agents["llm_0"], envs[0], s, n)
        row["checkpoints"] = [str(p_path), str(c_path)]
        rows.append(_trained_row(row, cory_agents, _frozen_copy(base), envs, n))
        progress(_row_text(rows[-1]))
    return first, {"per_seed": rows, **cross_role_summary(rows)}


def _pair_by_seed(ppo: list[str], observer_only: list[str]) -> dict[int, tuple[str, str]]:
    """{seed: (PPO checkpoint, cory-no-re checkpoint)}, read before any model loads; a
    ValueError naming a checkpoint of the wrong method, an unfinished run, another budget, a
    repeated seed or a seed without its partner."""
    by_method, first = {}, None
    for want, paths in (("ppo", ppo), ("cory-no-re", observer_only)):
        seeds = {}
        for path in paths:
            state = read_checkpoint(path)
            cfg = saved_config(state)
            got, ok = resolve_method(cfg.method), resolve_method(want)
            if (got.learner, got.structure) != (ok.learner, ok.structure):
                raise ValueError(f"checkpoint {path} was trained with method {cfg.method!r}, "
                                 f"not {want!r}")
            if int(state["iteration"]) != cfg.iterations:
                raise ValueError(f"checkpoint {path} is at iteration {int(state['iteration'])} "
                                 f"of {cfg.iterations}: not a finished run")
            first = first or cfg
            _check_budget(first, cfg, path)
            if cfg.seed in seeds:
                raise ValueError(f"checkpoints {seeds[cfg.seed]} and {path} have the same "
                                 f"seed {cfg.seed}")
            seeds[cfg.seed] = path
        by_method[want] = seeds
    a, b = by_method["ppo"], by_method["cory-no-re"]
    if not a or set(a) != set(b):
        raise ValueError(f"PPO and cory-no-re checkpoints must cover the same seeds: PPO "
                         f"{sorted(a)}, cory-no-re {sorted(b)}")
    return {s: (a[s], b[s]) for s in a}


def _check_budget(want: TrainConfig, got: TrainConfig, path: str) -> None:
    """A ValueError when a checkpoint's training budget differs from the first one's."""
    keys = ("task", "task_options", "model", "iterations", "batch_size", "max_new_tokens",
            "lora", "mixed_precision")
    diff = [k for k in keys if getattr(want, k) != getattr(got, k)]
    if want.ppo.lr != got.ppo.lr:
        diff.append("lr")
    if diff:
        raise ValueError(f"checkpoint {path} was trained at another budget ({', '.join(diff)} "
                         f"differ from the first PPO checkpoint's)")


def _cross_envs(task, tokenizer, max_new: int, n: int) -> tuple:
    """The alone env and the observer env of the cross-role measurements."""
    return (_env(task, tokenizer, max_new, min(n, 64), n_agents=1),
            _env(task, tokenizer, max_new, n))


def _base_row(seed: int, base, base_copy, envs, n: int) -> dict:
    """The base model alone and as observer of its own answers."""
    return {"seed": seed, "alone_base": _alone(base, envs[0], seed, n),
            "observer_base": _as_observer(base_copy, base_copy, envs[1], seed, n)}


def _trained_row(row: dict, cory: dict, base_copy, envs, n: int) -> dict:
    """A seed's row completed with the cory-no-re models' rewards and both ratios."""
    s, (alone, kt) = row["seed"], envs
    pio, obs = cory["llm_0"], cory["llm_1"]
    row["alone_observer_only"] = _alone(obs, alone, s, n)
    row["alone_pioneer_only"] = _alone(pio, alone, s, n)
    row["observer_observer_only"] = _as_observer(obs, base_copy, kt, s, n)
    row["observer_pioneer_only"] = _as_observer(pio, base_copy, kt, s, n)
    row["ratio"] = _ratio(row["alone_observer_only"] - row["alone_base"],
                          row["alone_ppo"] - row["alone_base"])
    row["reverse"] = _ratio(row["observer_pioneer_only"] - row["observer_base"],
                            row["observer_observer_only"] - row["observer_base"])
    return row


def _row_text(row: dict) -> str:
    """One seed's figures as a progress line."""
    return (f"[cory transfer] seed {row['seed']}: alone base {row['alone_base']:.3f}, PPO "
            f"{row['alone_ppo']:.3f}, observer-only {row['alone_observer_only']:.3f} -> "
            f"cross-role transfer {row['ratio']:.2f}; reverse {row['reverse']:.2f}")


def _ratio(num: float, den: float) -> float:
    """num / den, NaN when the denominator is not positive (one seed's figure, shown only)."""
    return num / den if den > 0 else math.nan


def _frozen_copy(policy):
    """The policy's frozen reference as a policy of its own (the base model), run at the
    policy's precision (a full fine-tuning run under bf16 stores its reference in bf16)."""
    ref = getattr(policy, "ref_model", None)
    return as_policy(ref, policy.mixed_precision) if ref is not None else policy


def measure_transfer(task: str, model: str | None = None, cfg: TrainConfig | None = None,
                     seeds=SEEDS, n: int = QUERIES, save: bool = True, progress=print,
                     out: str | None = None,
                     checkpoints: tuple[list[str], list[str]] | None = None) -> dict:
    """Knowledge and cross-role transfer of a task's model at `cfg`'s training budget.

    `model`: any model (a short name, a GGUF file, a folder; default: the task's offline
    reference LM); `cfg`: the training settings (default `TrainConfig()`; its task and model
    are set here); `seeds`, `n`: seeds and held-out queries of every measurement;
    `checkpoints`: (PPO checkpoints, cory-no-re checkpoints) already trained, one per seed
    (`checkpoint_cross_role`), instead of training them here: their task, model, budget and
    seeds are used. When `save`, the result is written to `out`, else to the model folder's
    transfer.json (a folder with a build report: an offline LM) or transfer-<task>.json;
    `result["file"]` says where.
    """
    t0 = time.perf_counter()
    trained = None
    if checkpoints is not None:
        cfg, trained = checkpoint_cross_role(*checkpoints, n=n, progress=progress)
        if cfg.task != task:
            raise ValueError(f"the checkpoints were trained on task {cfg.task!r}, not {task!r}")
        model, seeds = cfg.model, [r["seed"] for r in trained["per_seed"]]
    cfg = replace(cfg or TrainConfig(), task=task, model=model).validate()
    first = Trainer(replace(cfg, method="ppo", iterations=1))
    path = Path(model_of(cfg, "llm_0") or default_model(task))
    own = (path / "report.json").exists()  # an offline reference LM: one task's model
    file = Path(out) if out else path / "transfer.json" if own else transfer_file(path, task)
    env = first.env
    result = {"task": task, "model": str(model or path), "seeds": list(seeds), "queries": n,
              "file": str(file),
              "budget": training_budget(cfg),
              "knowledge_transfer": knowledge_transfer(
                  first.learner.policies["llm_0"], env.task, env.tokenizer, env.max_new_tokens,
                  seeds, n)}
    del first
    if trained is not None:
        result["trained_from"] = [r["checkpoints"] for r in trained["per_seed"]]
    result["cross_role"] = trained or cross_role_transfer(cfg, seeds, n, progress)
    result["verdict"] = summarize(result)["verdict"]
    result["seconds"] = time.perf_counter() - t0
    if save:
        atomic_write(file, json.dumps(result, indent=2))
        report = path / "report.json"
        if own and not out:  # the build report carries the figures too
            atomic_write(report, json.dumps({**json.loads(report.read_text()),
                                             "transfer": result}, indent=2))
    return result


