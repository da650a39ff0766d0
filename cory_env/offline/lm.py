"""Small GPT-2 reference LMs for the offline tasks, pretrained offline on their generated corpora.

    from cory_env.offline.lm import reference_lm
    path = reference_lm("arithmetic")          # built on first use (~5 min on 2 cores), then cached
    model = GPT2LMHeadModel.from_pretrained(path); tok = AutoTokenizer.from_pretrained(path)

or, from a shell, ``python -m cory_env.offline.lm [--tasks sentiment,arithmetic]
[--budget full|tiny] [--force]`` builds them and prints their reports.

The training data are token sequences assembled exactly as the env assembles its prompts: the
static pieces of the task's pioneer/observer templates are tokenized on their own and the
query/response token ids are inserted as they are (see ``cory_env.core.TemplateRenderer``).
So a prompt the env shows the model has the same tokens as the pretraining data, including the
lone space token after ``Question: `` and ``positive: `` that whole-text tokenization would
merge into the next word.

- ``sentiment``: whole generated reviews (the pioneer's job: continue a 2-8 token prefix) and,
  60% of the time in the "full" budget, observer sequences: the observer template filled with
  a review prefix and its next (usually 12) tokens, followed by the more positive rewrite
  (``corpus.positivise``) of those tokens.
- ``arithmetic``: 25% pioneer sequences (one-shot prompt, question, worked solution), 75%
  observer sequences whose ``Reference:`` is a right or wrong solution (half each, cut to the
  env's 40 response tokens), followed by the right solution. The loss weighs the prompt's
  tokens (mostly names and objects of the question, never generated) 0.2, so the model's
  capacity goes to the solutions.

Every sequence ends with EOS and starts at position 0 (no packing), as env prompts do. The
arithmetic one-shot prompt that all rows of a batch share is computed once per batch
(``lm_loss``). Training is seeded, its data order fixed and its thread count fixed per budget,
so a build is reproducible on a given kind of machine. ``report.json`` in the model folder
holds held-out measurements (``build_report``).

Measured (4 layers, n_embd 128, ~0.95M parameters; each model's ``report.json`` has the
numbers): the sentiment observer rewrites towards positive and so beats the no-transfer
observer by a wide margin (+1.0 reward). The arithmetic LM solves about 21% of held-out
problems at temperature 1 (28% greedy). Given a right reference it answers right 51% of the
time; it copies a wrong one 27% of the time. With the pioneer's own sampled attempts as
references the observer gains +0.059 before RL in the build's 512 episodes, and +0.029 +- 0.009
(standard error) over 6 x 512 more, each of the 7 positive.

Why that gain is small, and what raised it: 371 of 376 wrong pioneer answers in one 512-episode
sample (an earlier build) hold a wrong sum, difference or product ("13 + 7 = 13"). The
pioneer's attempt is a sample from the observer's own beliefs, so it tells the observer nothing
it could not compute, unless the observer can check an equation more reliably than it can write
one, and for table facts it cannot. What a reference can still do is sharpen: an observer that
leans towards the reference gains where the reference agrees with its most likely answer and
loses elsewhere, a net gain because its greedy accuracy is above its sampled one. That needs
the observer format to be learnt as well as the pioneer's. With 40% observer sequences the gap
was -0.006; with 60%, +0.012 +- 0.008 (+0.023 +- 0.005 for a 1-thread build); with 75%, the
default, the figures above. What did not help: references right 70% of the time, references
wrong at any step (later steps following the slip) or by a far-off number, drill lines of bare
equations, and a second phase on the model's own attempts.

Decoding (the measurements here and the agents' rollouts) uses ``kvcache.growing_cache``, which
appends keys and values in place; with the fused tanh GELU that made the measurements 2.4x
faster than with HF's concatenating cache.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from cory_env.offline import corpus
from cory_env.offline.build import TASKS, task_tokenizer
from cory_env.offline.cache import cache_dir, cached_dir
from cory_env.offline.kvcache import growing_cache

BUDGET_ENV = "CORY_LM_BUDGET"
# Per task: bump when its data, model or training change; old caches are then ignored.
VERSIONS = {"sentiment": "v3", "arithmetic": "v5"}
_TRAIN_SEED, _HELDOUT_SEED = 31, 97  # corpus seeds; the env's queries use seeds 0/1 and 1000/1001


@dataclass(frozen=True)
class Budget:
    """Model size, optimisation and evaluation settings of one build preset."""

    n_layer: int
    n_embd: int
    n_head: int
    steps: int
    batch_size: int
    lr: float
    warmup: int
    n_positions: int = 256
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1
    n_heldout: int = 512  # held-out sequences for the perplexity
    eval_episodes: int = 256  # env episodes per measurement
    n_samples: int = 3
    prompt_weight: float = 1.0  # loss weight of prompt tokens (responses and EOS weigh 1)
    mix: tuple = ()  # overrides of MIXES[task], as (key, value) pairs
    threads: int = 1  # fixed, so the numerics (and so the weights) do not depend on the machine
    seed: int = 0


# Shares of the training sequences: "observer" sequences (the rest are pioneer sequences), and
# for arithmetic the share of observer sequences whose reference is right.
MIXES = {"sentiment": {"observer": 0.3}, "arithmetic": {"observer": 0.75, "right_reference": 0.5}}

_TINY = Budget(n_layer=2, n_embd=48, n_head=2, steps=40, batch_size=16, lr=1e-2, warmup=5,
               n_heldout=32, eval_episodes=8, n_samples=2)
# BUDGETS[name][task]: "full" is the real default, "tiny" is for tests (seconds, same code path).
BUDGETS: dict[str, dict[str, Budget]] = {
    "full": {
        "sentiment": Budget(n_layer=4, n_embd=128, n_head=4, steps=600, batch_size=48, lr=5e-3,
                            warmup=40, threads=2, mix=(("observer", 0.6),)),
        "arithmetic": Budget(n_layer=4, n_embd=128, n_head=4, steps=1800, batch_size=12,
                             lr=4e-3, warmup=60, threads=2, prompt_weight=0.2,
                             eval_episodes=512),
    },
    "tiny": {"sentiment": _TINY, "arithmetic": _TINY},
}


def resolve_budget(budget: str | None = None) -> str:
    """The budget name: ``budget``, else ``$CORY_LM_BUDGET``, else "full"."""
    name = budget or os.environ.get(BUDGET_ENV) or "full"
    if name not in BUDGETS:
        raise ValueError(f"unknown LM budget {name!r}; expected one of {sorted(BUDGETS)}")
    return name


def model_dir(task: str, budget: str | None = None) -> Path:
    """Where the model of ``task`` and ``budget`` is (or will be) cached."""
    _check_task(task)
    return cache_dir() / "models" / f"{task}-{resolve_budget(budget)}-{VERSIONS[task]}"


def reference_lm(task: str, *, budget: str | None = None, verbose: bool = True) -> Path:
    """Return the folder of ``task``'s pretrained GPT-2 LM and tokenizer, building it once.

    The folder holds ``save_pretrained`` output of a ``GPT2LMHeadModel`` and of the task's
    tokenizer, plus ``report.json`` (see ``build_report``). ``budget`` picks a preset of
    ``BUDGETS`` ("full" by default, or ``$CORY_LM_BUDGET``; "tiny" is for tests).
    """
    name = resolve_budget(budget)
    final = model_dir(task, name)
    return cached_dir(final, lambda out: _launch(task, name, out, verbose=verbose))


def _launch(task: str, budget: str, out: Path, verbose: bool = True) -> None:
    """Run ``_build``: in this process, or in a child whose OpenMP threads suit the load.

    OpenMP's default spin-waiting makes training several times slower when other jobs keep the
    cores busy, and fully passive waiting costs about 30% on an idle machine. Both can only be
    set before torch loads, hence the child process (``_omp_wait_env`` picks the setting).
    """
    if BUDGETS[budget][task].threads == 1 or _OMP_WAIT_VARS & set(os.environ):
        _build(task, budget, out, verbose=verbose)
        return
    import cory_env

    root = str(Path(cory_env.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    wait = _omp_wait_env()
    env = {**os.environ, **wait, "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "cory_env.offline.lm", "--worker", task, budget, str(out)]
    if verbose:
        print(f"[cory lm] build child with {' '.join(f'{k}={v}' for k, v in wait.items())}",
              flush=True)
    else:
        cmd.append("--quiet")
    subprocess.run(cmd, env=env, check=True)


_OMP_WAIT_VARS = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}


def _omp_wait_env(load: float | None = None) -> dict[str, str]:
    """OpenMP wait settings for a build child: short spins when idle, passive when busy.

    ``load`` is the number of busy cores (default: measured now, ``_busy_cores``).

    Measured with 2 threads on 2 cores (ms per arithmetic training step, idle / next to a second
    such job): default 80 / several times slower, ``GOMP_SPINCOUNT=2000`` 88 / 182, passive
    112 / 136. Waiting never changes the numbers computed, only the time.
    """
    load = _busy_cores() if load is None else load
    if load > 0.75:
        return {"OMP_WAIT_POLICY": "PASSIVE"}
    return {"GOMP_SPINCOUNT": "2000"}


def _busy_cores(seconds: float = 0.5) -> float:
    """How many cores other work keeps busy now (from /proc/stat; else the 1-minute load).

    The load average would still count the build that just finished, so it is only a fallback.
    """
    def sample() -> list[int]:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]

    try:
        a = sample()
        time.sleep(seconds)
        b = sample()
    except (OSError, ValueError):
        return os.getloadavg()[0]
    delta = [y - x for x, y in zip(a, b)]
    idle = delta[3] + (delta[4] if len(delta) > 4 else 0)  # idle + iowait
    return (1 - idle / max(1, sum(delta))) * (os.cpu_count() or 1)


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


# ---------------------------------------------------------------------------------------------
# Training sequences, assembled like the env's prompts
# ---------------------------------------------------------------------------------------------


def _pieces(template: str, tokenizer) -> list:
    """The env's own tokenization of a template: static ids arrays and slot names."""
    from cory_env.core import TemplateRenderer
    from cory_env.tasks.base import Template

    return TemplateRenderer(Template(template), tokenizer).pieces


def _assemble(pieces: list, query: Sequence[int], response: Sequence[int] = ()) -> list[int]:
    """Concatenate template pieces with the query/response ids, as the env's renderer does."""
    from cory_env.tasks.base import QUERY

    out: list[int] = []
    for piece in pieces:
        if isinstance(piece, str):
            out.extend(query if piece == QUERY else response)
        else:
            out.extend(int(i) for i in piece)
    return out


@dataclass
class Sequences:
    """Token sequences (each ending with EOS) and the length of each one's prompt part."""

    ids: list[list[int]]
    prompt_lens: list[int]


class _Data:
    """Generates a task's token sequences (and held-out evaluation material)."""

    def __init__(self, task: str, mix: dict | None = None):
        from cory_env import make_task

        self.name = task
        self.mix = {**MIXES[task], **(mix or {})}
        self.task = make_task(task)
        self.tok = task_tokenizer(task)
        self.eos = self.tok.eos_token_id
        self.max_new = self.task.default_max_new_tokens
        self.pio = _pieces(self.task.pioneer_template, self.tok)
        self.obs = _pieces(self.task.observer_template, self.tok)

    # -- sentiment ------------------------------------------------------------------------
    def reviews(self, n: int, seed: int) -> list[list[int]]:
        """Token ids of ``n`` generated reviews (the env cuts its prefixes from such ids)."""
        texts = [t for t, _ in corpus.sentiment_reviews(n, seed)]
        return self.tok(texts, add_special_tokens=False)["input_ids"]

    def split_review(self, ids: list[int], rng: random.Random) -> tuple[list, list]:
        """A 2-8 token prefix (the env's query) and its next tokens (a pioneer's response)."""
        k = min(rng.randint(2, 8), len(ids) - 1)
        m = self.max_new if rng.random() < 0.75 else rng.randint(3, self.max_new - 1)
        return ids[:k], ids[k:k + m]

    def rewrite(self, query: list[int], cont: list[int], rng: random.Random) -> list[int]:
        """The more positive version of ``cont`` as tokens that follow ``query``."""
        q_text = self.tok.decode(query)
        new = corpus.positivise(self.tok.decode(cont), rng)
        whole = self.tok.encode(q_text + new, add_special_tokens=False)
        if whole[: len(query)] == list(query):
            return whole[len(query):]
        return self.tok.encode(new, add_special_tokens=False)

    def _sentiment(self, n: int, seed: int) -> list[tuple[list[int], list[int]]]:
        rng = random.Random(f"lm-sentiment:{seed}")
        out = []
        for ids in self.reviews(n, seed):
            if rng.random() < self.mix["observer"]:
                query, cont = self.split_review(ids, rng)
                out.append((_assemble(self.obs, query, cont), self.rewrite(query, cont, rng)))
            else:
                out.append(([], list(ids)))
        return out

    # -- arithmetic -----------------------------------------------------------------------
    def solution_ids(self, solution: str) -> list[int]:
        """A solution as the pioneer writes it after ``Answer:`` (leading space)."""
        return self.tok.encode(" " + solution, add_special_tokens=False)

    def _arithmetic(self, n: int, seed: int, split: str) -> list[tuple[list[int], list[int]]]:
        rng = random.Random(f"lm-arithmetic:{seed}")
        out = []
        for p in corpus.arithmetic_problems(n, seed, split):
            q = self.tok.encode(p["question"], add_special_tokens=False)
            answer = self.solution_ids(p["solution"])
            if rng.random() < self.mix["observer"]:
                right = rng.random() < self.mix["right_reference"]
                ref = p["solution"] if right else corpus.wrong_solution(rng, p)
                ref_ids = self.solution_ids(ref)[: self.max_new]  # as long as the env allows
                out.append((_assemble(self.obs, q, ref_ids), answer))
            else:
                out.append((_assemble(self.pio, q), answer))
        return out

    def sequences(self, n: int, seed: int, heldout: bool = False) -> Sequences:
        """``n`` training (or held-out) sequences, each ending with EOS."""
        if self.name == "sentiment":
            pairs = self._sentiment(n, seed)
        else:
            pairs = self._arithmetic(n, seed, "test" if heldout else "train")
        return Sequences([p + r + [self.eos] for p, r in pairs], [len(p) for p, _ in pairs])


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def _batches(seqs: list[list[int]], batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """``steps`` batches of sequence indices: epochs of shuffled, length-bucketed batches."""
    seqs = seqs.ids if isinstance(seqs, Sequences) else seqs
    rng = random.Random(seed)
    out: list[list[int]] = []
    while len(out) < steps:
        order = list(range(len(seqs)))
        rng.shuffle(order)
        chunk = batch_size * 32  # sort within chunks so each batch has similar lengths
        epoch = []
        for i in range(0, len(order) - batch_size + 1, chunk):
            part = sorted(order[i:i + chunk], key=lambda j: len(seqs[j]))
            epoch += [part[b:b + batch_size] for b in range(0, len(part) - batch_size + 1,
                                                          batch_size)]
        rng.shuffle(epoch)
        out += epoch
    return out[:steps]


def _pad(seqs: Sequences, rows: Sequence[int], pad: int, prompt_weight: float = 1.0):
    """Right-padded (ids, mask, weights) of some rows (every sequence starts at position 0).

    ``weights[i, t]`` weighs the loss of predicting token t: ``prompt_weight`` inside the
    prompt, 1 in the response (and its EOS), 0 at position 0 and on padding.
    """
    width = max(len(seqs.ids[i]) for i in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    weights = torch.zeros((len(rows), width))
    for r, i in enumerate(rows):
        n, k = len(seqs.ids[i]), seqs.prompt_lens[i]
        ids[r, :n] = torch.tensor(seqs.ids[i])
        mask[r, :n] = 1
        weights[r, 1:n] = 1.0
        weights[r, 1:k] = prompt_weight
    return ids, mask, weights


def _lr_lambda(b: Budget) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to ``min_lr_ratio``."""
    def f(step: int) -> float:
        if step < b.warmup:
            return (step + 1) / b.warmup
        t = (step - b.warmup) / max(1, b.steps - b.warmup)
        return b.min_lr_ratio + (1 - b.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))
    return f


def _new_model(vocab: int, eos: int, b: Budget):
    from transformers import GPT2Config, GPT2LMHeadModel

    # gelu_pytorch_tanh: GPT-2's tanh GELU as one fused op (HF's default is five Python ops)
    config = GPT2Config(vocab_size=vocab, n_positions=b.n_positions, n_embd=b.n_embd,
                        n_layer=b.n_layer, n_head=b.n_head, activation_function="gelu_pytorch_tanh",
                        resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(b.seed)
    return GPT2LMHeadModel(config)


def _cache_arg(model) -> str:
    """The KV-cache keyword: ``cache`` in newer transformers, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _out_cache(out):
    """The KV cache a forward pass returned (its attribute name follows the keyword)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _common_prefix(ids: torch.Tensor, mask: torch.Tensor) -> int:
    """Length of the token prefix that every row shares (shorter than the shortest row)."""
    same = (ids == ids[:1]).all(0) & mask.bool().all(0)
    n = int(same.long().cumprod(0).sum())
    return min(n, int(mask.sum(1).min()) - 1)


def lm_loss(model, ids: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor,
            min_shared: int = 16) -> torch.Tensor:
    """Weighted mean next-token NLL of right-padded rows that start at position 0.

    ``weights[i, t]`` weighs the prediction of ``ids[i, t]`` (see ``_pad``). Rows that share a
    long prefix (the arithmetic one-shot prompt) have it computed once and its keys/values
    repeated for every row: the same loss and gradient, up to rounding, for less compute.
    """
    ce = torch.nn.functional.cross_entropy
    shared = _common_prefix(ids, mask)
    if shared < min_shared:
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        nll = ce(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        return (nll * weights[:, 1:]).sum() / weights.sum()
    from transformers import DynamicCache

    batch = ids.shape[0]
    cache = DynamicCache()
    kw = _cache_arg(model.transformer)
    pre = model.transformer(input_ids=ids[:1, :shared], use_cache=True, **{kw: cache})
    cache.batch_repeat_interleave(batch)
    pos = torch.arange(shared, ids.shape[1]).expand(batch, -1)
    hidden = model.transformer(input_ids=ids[:, shared:], attention_mask=mask, position_ids=pos,
                               use_cache=True, **{kw: cache}).last_hidden_state
    pre_hidden = pre.last_hidden_state[0]  # (shared, E), the same for every row
    pre_nll = ce(model.lm_head(pre_hidden[:-1]).float(), ids[0, 1:shared], reduction="none")
    last = pre_hidden[-1:].expand(batch, 1, -1)
    logits = model.lm_head(torch.cat([last, hidden[:, :-1]], dim=1)).float()
    nll = ce(logits.transpose(1, 2), ids[:, shared:], reduction="none")
    total = (pre_nll * weights[:, 1:shared].sum(0)).sum() + (nll * weights[:, shared:]).sum()
    return total / weights.sum()


def _fast_bf16() -> bool:
    """Whether this CPU has native bf16 matmuls (then training autocasts to bf16, ~1.6x faster)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def _train(model, seqs: Sequences, b: Budget, pad: int, log=print) -> dict:
    """AdamW on the padded sequences (loss on every real token, EOS included)."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "wpe" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": b.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=b.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(b))
    model.train()
    bf16 = _fast_bf16()
    start, tokens, recent = time.perf_counter(), 0, []
    for step, batch in enumerate(_batches(seqs, b.batch_size, b.steps, b.seed)):
        ids, mask, weights = _pad(seqs, batch, pad, b.prompt_weight)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = lm_loss(model, ids, mask, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        tokens += int(mask.sum())
        recent = (recent + [loss.item()])[-20:]
        if log and (step + 1) % max(1, b.steps // 6) == 0:
            log(f"  step {step + 1}/{b.steps}  loss {np.mean(recent):.3f}  "
                f"{time.perf_counter() - start:.0f}s")
    model.eval()
    return {"steps": b.steps, "batch_size": b.batch_size, "tokens": tokens,
            "final_loss": float(np.mean(recent)), "seconds": time.perf_counter() - start,
            "autocast": "bf16" if bf16 else "none", "threads": torch.get_num_threads()}


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """Run torch ops on ``n`` intra-op threads inside the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _build(task: str, budget: str, out: Path, verbose: bool = True) -> None:
    """Train ``task``'s LM with ``budget`` into ``out``; write its report there."""
    log = print if verbose else None
    b = BUDGETS[budget][task]
    with _threads(b.threads):
        t0 = time.perf_counter()
        data = _Data(task, dict(b.mix))
        seqs = data.sequences(b.steps * b.batch_size, _TRAIN_SEED)
        longest = max(len(s) for s in seqs.ids)
        if longest > b.n_positions:
            raise ValueError(f"{task} sequences reach {longest} tokens > {b.n_positions}")
        model = _new_model(len(data.tok), data.eos, b)
        if log:
            n = sum(p.numel() for p in model.parameters())
            log(f"[cory lm] building {task}-{budget}: {n / 1e6:.2f}M params, "
                f"{len(seqs.ids)} sequences, data {time.perf_counter() - t0:.1f}s")
        train = _train(model, seqs, b, data.eos, log)
        model.save_pretrained(str(out))
        data.tok.save_pretrained(str(out))
        meta = {"task": task, "budget": budget, "version": VERSIONS[task],
                "budget_settings": asdict(b),
                "train": train, "build_seconds": None}
        (out / "build.json").write_text(json.dumps(meta, indent=1))
        report = build_report(task, out, model=model)
        meta["build_seconds"] = report["build_seconds"] = time.perf_counter() - t0
        (out / "build.json").write_text(json.dumps(meta, indent=1))
        (out / "report.json").write_text(json.dumps(report, indent=1))
        if log:
            log(format_report(report))


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def perplexity(model, seqs: Sequences, pad: int, batch_size: int = 64,
               response_only: bool = False) -> float:
    """exp(mean NLL per predicted token) over ``seqs`` (or over their responses and EOS)."""
    total, count = 0.0, 0
    for i in range(0, len(seqs.ids), batch_size):
        rows = range(i, min(i + batch_size, len(seqs.ids)))
        ids, mask, weights = _pad(seqs, rows, pad, prompt_weight=float(not response_only))
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:],
                                                reduction="none")
        total += float((nll * weights[:, 1:]).sum())
        count += float(weights[:, 1:].sum())
    return math.exp(total / max(count, 1.0))


@torch.no_grad()
def play_turn(model, env, generator: torch.Generator | None = None,
              forced: torch.Tensor | None = None, greedy: bool = False) -> None:
    """Play the env's current turn for every episode with ``model`` (KV-cached decoding).

    Tokens are sampled at temperature 1 with no top-k/top-p (or taken greedily, or from
    ``forced`` (B, T) ids). The prompt is the env's right-aligned block of columns [0, P),
    pads masked out and positions counted from each row's first real token. Forced tokens
    need no model: they go straight to the env.
    """
    if forced is not None:
        role, t = env.role, 0
        while not (env.finished or env.role != role):
            env.step(forced[:, t])
            t += 1
        return
    obs = env.observe()
    p = env.prompt_len
    mask = obs["attention_mask"][:, :p]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    kw = _cache_arg(model)
    cache = growing_cache(p + env.max_new_tokens)
    out = model(input_ids=obs["input_ids"][:, :p], attention_mask=mask, position_ids=pos,
                use_cache=True, **({kw: cache} if cache is not None else {}))
    past, logits, next_pos = _out_cache(out), out.logits[:, -1], mask.sum(-1)
    role, t = env.role, 0
    while True:
        if greedy:
            tok = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.float(), -1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        env.step(tok)
        t += 1
        if env.finished or env.role != role:
            return
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=mask,
                    position_ids=(next_pos + t - 1)[:, None], use_cache=True, **{kw: past})
        past, logits = _out_cache(out), out.logits[:, -1]


def _episode(model, env, queries, generator, forced=None, greedy=False) -> dict:
    """One batch of episodes; returns each role's responses and task rewards."""
    env.reset(options={"queries": list(queries)})
    play_turn(model, env, generator, forced=forced, greedy=greedy)
    play_turn(model, env, generator)
    out = {}
    for info in env.infos().values():
        out[info["role"]] = {"responses": info["response"],
                             "rewards": info["task_reward"].numpy().astype(float)}
    return out


def _forced(ids: list[list[int]], width: int, eos: int) -> torch.Tensor:
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
    positive, negative = corpus.sentiment_lexicon()
    words = [w.lower() for w in _WORD.findall(text)]
    if skip_first and words:
        words = words[1:]
    return [w for w in words if w not in _STOPWORDS and w not in positive | negative]


def _sentiment_copy(model, data: _Data, b: Budget, gen) -> dict:
    """Observer shown a held-out prefix + its real continuation: share of content words kept."""
    import cory_env
    from cory_env import Query

    rng = random.Random("lm-copy")
    queries, conts = [], []
    for ids in data.reviews(b.eval_episodes, _HELDOUT_SEED + 1):
        k = min(rng.randint(2, 8), len(ids) - 1)
        queries.append(Query(text=data.tok.decode(ids[:k]), ids=tuple(ids[:k])))
        conts.append(ids[k:k + data.max_new])
    env = cory_env.BatchedCoryEnv(batch_size=len(queries), task=data.name, split="test")
    ep = _episode(model, env, queries, gen, forced=_forced(conts, env.max_new_tokens, data.eos))
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


def _arithmetic_copy(model, data: _Data, b: Budget, gen) -> dict:
    """Observer shown a right (or wrong) held-out solution: how often it answers with it."""
    import cory_env
    from cory_env import Query
    from cory_env.tasks.base import last_number

    problems = corpus.arithmetic_problems(b.eval_episodes, _HELDOUT_SEED + 1, "test")
    queries = [Query(text=p["question"], answer=p["answer"]) for p in problems]
    env = cory_env.BatchedCoryEnv(batch_size=len(queries), task=data.name, split="test")
    rng = random.Random("lm-copy")
    right = [data.solution_ids(p["solution"]) for p in problems]
    wrong_text = [corpus.wrong_solution(rng, p) for p in problems]
    wrong = [data.solution_ids(w) for w in wrong_text]
    out = {}
    ep = _episode(model, env, queries, gen, forced=_forced(right, env.max_new_tokens, data.eos))
    out["copy_correct_reference"] = float(ep["observer"]["rewards"].mean())
    out["correct_reference_reward"] = float(ep["pioneer"]["rewards"].mean())
    ep = _episode(model, env, queries, gen, forced=_forced(wrong, env.max_new_tokens, data.eos))
    answers = [last_number(r) for r in ep["observer"]["responses"]]
    out["wrong_reference_answer_right"] = float(ep["observer"]["rewards"].mean())
    out["wrong_reference_copied"] = float(np.mean(
        [a == last_number(w) for a, w in zip(answers, wrong_text)]))
    return out


def _gap(model, data: _Data, b: Budget, gen) -> tuple[dict, list[dict]]:
    """Mean task rewards with and without knowledge transfer on the env's test queries."""
    import cory_env

    idx = list(range(b.eval_episodes))
    res, samples = {}, []
    for kt in (True, False):
        env = cory_env.BatchedCoryEnv(batch_size=len(idx), task=data.name, split="test",
                                      knowledge_transfer=kt)
        ep = _episode(model, env, idx, gen)
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
    play_turn(model, env, greedy=True)
    info = next(i for i in env.infos().values() if i["role"] == "pioneer")
    queries = env.task.queries("test")[: len(idx)]
    res["pioneer_reward_greedy"] = float(np.mean(env.task.reward(queries, info["response"])))
    return res, samples


def repeated_gap(task: str, path: str | Path, repeats: int = 6) -> dict:
    """The observer gap measured ``repeats`` more times (fresh sampling seeds): mean and SE."""
    model, meta, b = _saved_model(task, path)
    data, gaps = _Data(task), []
    with _threads(b.threads):
        for seed in range(repeats):
            gaps.append(_gap(model, data, b, torch.Generator().manual_seed(1000 + seed))[0]
                        ["observer_gap"])
    se = float(np.std(gaps, ddof=1) / np.sqrt(repeats)) if repeats > 1 else float("nan")
    return {"gaps": gaps, "mean": float(np.mean(gaps)), "se": se,
            "episodes_each": b.eval_episodes}


def _saved_model(task: str, path: str | Path, model=None) -> tuple:
    """(model in eval mode, build.json contents, the Budget it was built with) of a model folder."""
    from transformers import GPT2LMHeadModel

    _check_task(task)
    path = Path(path)
    if model is None:
        model = GPT2LMHeadModel.from_pretrained(str(path))
    model.eval()
    meta = json.loads((path / "build.json").read_text()) if (path / "build.json").exists() else {}
    settings = meta.get("budget_settings")
    b = Budget(**settings) if settings else BUDGETS[meta.get("budget", "full")][task]
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
    with _threads(b.threads):
        return _measure(task, model, meta, b)


def _measure(task: str, model, meta: dict, b: Budget) -> dict:
    data = _Data(task)
    gen = torch.Generator().manual_seed(b.seed + 1)
    t0 = time.perf_counter()
    heldout = data.sequences(b.n_heldout, _HELDOUT_SEED, heldout=True)
    report = {
        "task": task,
        "budget": meta.get("budget"),
        "model": {"n_params": sum(p.numel() for p in model.parameters()),
                  "n_layer": model.config.n_layer, "n_embd": model.config.n_embd,
                  "n_head": model.config.n_head, "n_positions": model.config.n_positions,
                  "vocab_size": model.config.vocab_size},
        "train": meta.get("train"),
        "heldout_perplexity": perplexity(model, heldout, data.eos),
        "heldout_response_perplexity": perplexity(model, heldout, data.eos, response_only=True),
    }
    copy = (_sentiment_copy if task == "sentiment" else _arithmetic_copy)(model, data, b, gen)
    gap, samples = _gap(model, data, b, gen)
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
    lines = [f"[cory lm] {r['task']}-{r['budget']}: {m['n_params'] / 1e6:.2f}M params "
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


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def _rebuild(task: str, budget: str, verbose: bool = True) -> Path:
    """Build anew even if cached: the old folder is moved aside, then removed."""
    final = model_dir(task, budget)
    if final.is_dir():
        trash = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
        os.replace(final, trash / "x")
        shutil.rmtree(trash, ignore_errors=True)
    return reference_lm(task, budget=budget, verbose=verbose)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cory_env.offline.lm",
                                     description="Build (once) the offline reference LMs and "
                                                 "print their held-out reports.")
    parser.add_argument("--tasks", default=",".join(TASKS),
                        help="comma-separated tasks (default: %(default)s)")
    parser.add_argument("--budget", default=None, choices=sorted(BUDGETS),
                        help=f"training preset (default: ${BUDGET_ENV} or full)")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--gap-repeats", type=int, default=0, metavar="N",
                        help="then measure each model's observer gap N more times (noise check)")
    parser.add_argument("--worker", nargs=3, metavar=("TASK", "BUDGET", "OUT"),
                        help=argparse.SUPPRESS)  # internal: build into OUT (see _launch)
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        task, budget, out = args.worker
        _build(task, budget, Path(out), verbose=not args.quiet)
        return 0
    budget = resolve_budget(args.budget)
    for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        _check_task(task)
        t0 = time.perf_counter()
        cached = model_dir(task, budget).is_dir() and not args.force
        path = _rebuild(task, budget) if args.force else reference_lm(task, budget=budget)
        report = json.loads((path / "report.json").read_text())
        if cached:
            print(format_report(report))
        print(f"[cory lm] {task}-{budget}: {path} "
              f"({'cached' if cached else f'built in {time.perf_counter() - t0:.0f}s'})")
        if args.gap_repeats:
            r = repeated_gap(task, path, args.gap_repeats)
            print(f"[cory lm] {task} observer gap over {args.gap_repeats} x "
                  f"{r['episodes_each']} episodes: {r['mean']:+.3f} +- {r['se']:.3f} (SE); "
                  f"each: {' '.join(f'{g:+.3f}' for g in r['gaps'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
