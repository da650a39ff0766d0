"""Measurements of a reference LM before any RL: perplexity, in-context copying, and the gap.

    report = build_report("sentiment", path)      # what build() writes to report.json
    print(format_report(report))

Episodes are played in the real env through `agents.llm.rollout.play_turn` (the one decode loop),
with the LM wrapped as a policy: sampled at temperature 1 (no top-k/top-p), or greedily.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from pathlib import Path

import numpy as np
import torch

import cory_env
from cory_env import Query
from cory_env.data import arithmetic_corpus, sentiment_corpus
from cory_env.tasks.base import last_number

from ..llm.policy import LLMPolicy
from ..llm.rollout import play_turn
from ..llm.sampling import SamplingConfig
from ..llm.speed import threads
from .data import HELDOUT_SEED, Sequences, TrainingData, check_task, pad_rows
from .sizes import SIZES, LMSize

SAMPLED, GREEDY = SamplingConfig(), SamplingConfig(top_k=1)


@torch.no_grad()
def perplexity(model, seqs: Sequences, pad: int, batch_size: int = 64,
               response_only: bool = False) -> float:
    """exp(mean NLL per predicted token) over ``seqs`` (or over their responses and EOS)."""
    total, count = 0.0, 0
    for i in range(0, len(seqs.ids), batch_size):
        rows = range(i, min(i + batch_size, len(seqs.ids)))
        ids, mask, weights = pad_rows(seqs, rows, pad, prompt_weight=float(not response_only))
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:],
                                                reduction="none")
        total += float((nll * weights[:, 1:]).sum())
        count += float(weights[:, 1:].sum())
    return math.exp(total / max(count, 1.0))


def as_policy(model, mixed_precision: str | None = None) -> LLMPolicy:
    """A bare HF causal LM as a policy that plays env turns (no reference; float32 unless a
    `mixed_precision` is given, as for a trained policy's bf16-stored reference)."""
    return LLMPolicy(model, reference=None, mixed_precision=mixed_precision)


def play_episode(model, env, queries, generator, forced=None, observer=None) -> dict:
    """One batch of episodes, `model` in both roles (or `observer` as the observer, or the
    pioneer's `forced` tokens); returns each role's responses and task rewards."""
    env.reset(options={"queries": list(queries)})
    play_turn(env, model, SAMPLED, generator, forced=forced)
    play_turn(env, observer or model, SAMPLED, generator)
    out = {}
    for info in env.infos().values():
        out[info["role"]] = {"responses": info["response"],
                             "rewards": info["task_reward"].numpy().astype(float)}
    return out


def forced_tokens(ids: list[list[int]], width: int, eos: int) -> torch.Tensor:
    """(B, width) forced pioneer tokens: each row's ids, then EOS."""
    out = torch.full((len(ids), width), eos, dtype=torch.long)
    for i, row in enumerate(ids):
        row = row[: width]
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


_STOPWORDS = frozenset(
    "a an the and or but so of in on at to for with from by as is was were are be been it its "
    "this that these those i my me we our you your he she his her they their them one very "
    "really quite rather truly not never hardly far all no nor than too just also even".split()
)
_WORD = re.compile(r"[A-Za-z0-9']+")


def content_words(text: str, skip_first: bool = False) -> list[str]:
    """Lower-cased words of ``text`` that are neither stopwords nor sentiment words."""
    positive, negative = sentiment_corpus.sentiment_lexicon()
    words = [w.lower() for w in _WORD.findall(text)]
    if skip_first and words:
        words = words[1:]
    return [w for w in words if w not in _STOPWORDS and w not in positive | negative]


def _sentiment_copy(model, data: TrainingData, b: LMSize, gen) -> dict:
    """Observer shown a held-out prefix + its real continuation: share of content words kept."""
    rng = random.Random("lm-copy")
    queries, conts = [], []
    for ids in data.reviews(b.eval_episodes, HELDOUT_SEED + 1):
        k = min(rng.randint(2, 8), len(ids) - 1)
        queries.append(Query(text=data.tok.decode(ids[:k]), ids=tuple(ids[:k])))
        conts.append(ids[k:k + data.max_new])
    env = cory_env.BatchedCoryEnv(batch_size=len(queries), task=data.name, split="test")
    ep = play_episode(model, env, queries, gen,
                      forced=forced_tokens(conts, env.max_new_tokens, data.eos))
    kept = total = 0
    for cont, rewrite in zip(conts, ep["observer"]["responses"]):
        cont_text = data.tok.decode(cont)
        words = content_words(cont_text, skip_first=not cont_text.startswith(" "))
        have = set(content_words(rewrite))
        kept += sum(w in have for w in words)
        total += len(words)
    return {"content_word_copy_rate": kept / max(total, 1), "content_words": total,
            "continuation_reward": float(ep["pioneer"]["rewards"].mean()),
            "rewrite_reward": float(ep["observer"]["rewards"].mean())}


def _arithmetic_copy(model, data: TrainingData, b: LMSize, gen) -> dict:
    """Observer shown a right (or wrong) held-out solution: how often it answers with it."""
    problems = arithmetic_corpus.arithmetic_problems(b.eval_episodes, HELDOUT_SEED + 1, "test")
    queries = [Query(text=p["question"], answer=p["answer"]) for p in problems]
    env = cory_env.BatchedCoryEnv(batch_size=len(queries), task=data.name, split="test")
    rng = random.Random("lm-copy")
    right = [data.solution_ids(p["solution"]) for p in problems]
    wrong_text = [arithmetic_corpus.wrong_solution(rng, p) for p in problems]
    wrong = [data.solution_ids(w) for w in wrong_text]
    out = {}
    ep = play_episode(model, env, queries, gen,
                      forced=forced_tokens(right, env.max_new_tokens, data.eos))
    out["copy_correct_reference"] = float(ep["observer"]["rewards"].mean())
    out["correct_reference_reward"] = float(ep["pioneer"]["rewards"].mean())
    ep = play_episode(model, env, queries, gen,
                      forced=forced_tokens(wrong, env.max_new_tokens, data.eos))
    answers = [last_number(r) for r in ep["observer"]["responses"]]
    out["wrong_reference_answer_right"] = float(ep["observer"]["rewards"].mean())
    out["wrong_reference_copied"] = float(np.mean(
        [a == last_number(w) for a, w in zip(answers, wrong_text)]))
    return out


def _gap(model, data: TrainingData, b: LMSize, gen) -> tuple[dict, list[dict]]:
    """Mean task rewards with and without knowledge transfer on the env's test queries."""
    idx = list(range(b.eval_episodes))
    res, samples = {}, []
    for kt in (True, False):
        env = cory_env.BatchedCoryEnv(batch_size=len(idx), task=data.name, split="test",
                                      knowledge_transfer=kt)
        ep = play_episode(model, env, idx, gen)
        tag = "kt" if kt else "no_kt"
        res[f"pioneer_reward_{tag}"] = float(ep["pioneer"]["rewards"].mean())
        res[f"observer_reward_{tag}"] = float(ep["observer"]["rewards"].mean())
        if kt:
            pool = env.task.queries("test")
            for i in range(b.n_samples):
                samples.append({"query": pool[i].text,
                                "pioneer": ep["pioneer"]["responses"][i],
                                "observer": ep["observer"]["responses"][i],
                                "rewards": [float(ep["pioneer"]["rewards"][i]),
                                            float(ep["observer"]["rewards"][i])]})
    res["observer_gap"] = res["observer_reward_kt"] - res["observer_reward_no_kt"]
    # the greedy pioneer on the same queries (its turn only, scored by the task)
    env = cory_env.BatchedCoryEnv(batch_size=len(idx), task=data.name, split="test")
    env.reset(options={"queries": idx})
    play_turn(env, model, GREEDY)
    info = next(i for i in env.infos().values() if i["role"] == "pioneer")
    queries = env.task.queries("test")[: len(idx)]
    res["pioneer_reward_greedy"] = float(np.mean(env.task.reward(queries, info["response"])))
    return res, samples


def repeated_gap(task: str, path: str | Path, repeats: int = 6) -> dict:
    """The observer gap measured ``repeats`` more times (fresh sampling seeds): mean and SE."""
    model, meta, b = _saved_model(task, path)
    data, gaps, policy = TrainingData(task), [], as_policy(model)
    with threads(b.threads):
        for seed in range(repeats):
            gen = torch.Generator().manual_seed(1000 + seed)
            gaps.append(_gap(policy, data, b, gen)[0]["observer_gap"])
    se = float(np.std(gaps, ddof=1) / np.sqrt(repeats)) if repeats > 1 else float("nan")
    return {"gaps": gaps, "mean": float(np.mean(gaps)), "se": se,
            "episodes_each": b.eval_episodes}


def _saved_model(task: str, path: str | Path, model=None) -> tuple:
    """(model in eval mode, build.json contents, the LMSize it was built with) of a model folder."""
    from transformers import GPT2LMHeadModel

    check_task(task)
    path = Path(path)
    if model is None:
        model = GPT2LMHeadModel.from_pretrained(str(path))
    model.eval()
    meta = json.loads((path / "build.json").read_text()) if (path / "build.json").exists() else {}
    meta.setdefault("size", meta.get("budget"))  # a model cached before the size's rename
    settings = meta.get("size_settings") or meta.get("budget_settings")
    b = LMSize(**settings) if settings else SIZES[meta.get("size", "full")][task]
    return model, meta, b


def build_report(task: str, path: str | Path, *, model=None) -> dict:
    """Held-out measurements of the LM in ``path`` (or of ``model``), as a JSON-able dict.

    Keys: ``heldout_perplexity`` (all tokens of held-out sequences, EOS included),
    ``samples`` (env episodes on test queries, sampled at temperature 1), ``copy`` (in-context
    copy ability of the observer), ``gap`` (observer reward with minus without knowledge
    transfer, both on the env's test queries, the pioneer's response sampled from the same LM),
    ``pioneer_pass@1`` (arithmetic: the pioneer's sampled exact-match rate on test problems;
    sentiment: its mean reward), plus the model/training facts from ``build.json``.
    """
    model, meta, b = _saved_model(task, path, model)
    with threads(b.threads):
        return _measure(task, model, meta, b)


def _measure(task: str, model, meta: dict, b: LMSize) -> dict:
    """The measurements of `build_report` (see there)."""
    data = TrainingData(task)
    gen = torch.Generator().manual_seed(b.seed + 1)
    t0 = time.perf_counter()
    heldout = data.sequences(b.n_heldout, HELDOUT_SEED, heldout=True)
    report = {
        "task": task,
        "size": meta.get("size"),
        "model": {"n_params": sum(p.numel() for p in model.parameters()),
                  "n_layer": model.config.n_layer, "n_embd": model.config.n_embd,
                  "n_head": model.config.n_head, "n_positions": model.config.n_positions,
                  "vocab_size": model.config.vocab_size},
        "train": meta.get("train"),
        "heldout_perplexity": perplexity(model, heldout, data.eos),
        "heldout_response_perplexity": perplexity(model, heldout, data.eos, response_only=True),
    }
    policy = as_policy(model)
    copy = (_sentiment_copy if task == "sentiment" else _arithmetic_copy)(policy, data, b, gen)
    gap, samples = _gap(policy, data, b, gen)
    report["copy"] = copy
    report["gap"] = gap
    report["observer_gap"] = gap["observer_gap"]
    pioneer = (gap["pioneer_reward_kt"] + gap["pioneer_reward_no_kt"]) / 2  # 2 samples each
    report["pioneer_pass@1"] = pioneer if task == "arithmetic" else None
    report["samples"] = samples
    report["eval_episodes"] = b.eval_episodes
    report["eval_seconds"] = time.perf_counter() - t0
    return report


def format_report(r: dict) -> str:
    """A compact, human-readable summary of a report."""
    m, g, c = r["model"], r["gap"], r["copy"]
    lines = [f"[cory lm] {r['task']}-{r['size']}: {m['n_params'] / 1e6:.2f}M params "
             f"({m['n_layer']}x{m['n_embd']}), held-out ppl {r['heldout_perplexity']:.2f} "
             f"(responses {r['heldout_response_perplexity']:.2f})"]
    if r.get("train"):
        t = r["train"]
        lines.append(f"  train: {t['steps']} steps, {t['tokens'] / 1e6:.2f}M tokens, "
                     f"loss {t['final_loss']:.3f}, {t['seconds']:.0f}s"
                     + (f"; build {r['build_seconds']:.0f}s" if r.get("build_seconds") else ""))
    lines.append("  copy: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                        for k, v in c.items()))
    lines.append(f"  observer reward kt {g['observer_reward_kt']:.3f} vs no-kt "
                 f"{g['observer_reward_no_kt']:.3f}: gap {g['observer_gap']:+.3f}; pioneer "
                 f"{g['pioneer_reward_kt']:.3f}/{g['pioneer_reward_no_kt']:.3f} sampled, "
                 f"{g['pioneer_reward_greedy']:.3f} greedy ({r['eval_episodes']} episodes)")
    for s in r["samples"][:2]:
        lines.append(f"  sample: {s['query']!r} -> pioneer {s['pioneer']!r} | "
                     f"observer {s['observer']!r}")
    return "\n".join(lines)
