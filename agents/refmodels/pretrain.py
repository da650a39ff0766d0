"""Pretraining the small GPT-2 reference LMs of the offline tasks, and their on-disk cache.

    from agents.refmodels import reference_lm
    path = reference_lm("arithmetic")   # built on first use (minutes on 2 cores), then cached

The sequences are `data.TrainingData`'s. The arithmetic loss weighs the prompt's tokens
(mostly names and objects of the question, never generated) 0.2, so the model's capacity goes
to the solutions, and the one-shot prompt that all rows of a batch share is computed once per
batch (``lm_loss``). Training is seeded, its data order fixed and its thread count fixed per
size, so a build is reproducible on a given kind of machine. After training, ``build``
writes the measurements of ``measure.build_report`` to ``report.json`` in the model folder.

A multi-threaded build runs in a child process whose OpenMP wait policy suits the machine's
load (it can only be set before torch loads); waiting never changes the numbers computed.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from cory_common.files import cache_dir, cached_dir, remove_dir
from cory_common.threads import POLICY, policy_in_force, wait_choice

from ..llm.loading import cache_kwarg
from ..llm.speed import threads
from .data import TRAIN_SEED, Sequences, TrainingData, batches, check_task, pad_rows
from .measure import build_report, format_report
from .sizes import SIZES, VERSIONS, LMSize

SIZE_ENV = "CORY_LM_SIZE"


def resolve_size(size: str | None = None) -> str:
    """The size name: ``size``, else ``$CORY_LM_SIZE``, else "full"."""
    name = size or os.environ.get(SIZE_ENV) or "full"
    if name not in SIZES:
        raise ValueError(f"unknown LM size {name!r}; expected one of {sorted(SIZES)}")
    return name


def model_dir(task: str, size: str | None = None) -> Path:
    """Where the model of ``task`` and ``size`` is (or will be) cached."""
    check_task(task)
    return cache_dir() / "models" / f"{task}-{resolve_size(size)}-{VERSIONS[task]}"


def reference_lm(task: str, *, size: str | None = None, verbose: bool = True) -> Path:
    """Return the folder of ``task``'s pretrained GPT-2 LM and tokenizer, building it once.

    The folder holds ``save_pretrained`` output of a ``GPT2LMHeadModel`` and of the task's
    tokenizer, plus ``report.json`` (see ``build_report``). ``size`` picks a preset of
    ``SIZES`` ("full" by default, or ``$CORY_LM_SIZE``; "tiny" is for tests).
    """
    name = resolve_size(size)
    final = model_dir(task, name)
    return cached_dir(final, lambda out: _launch(task, name, out, verbose=verbose))


def _launch(task: str, size: str, out: Path, verbose: bool = True) -> None:
    """Run ``build``: in this process, or in a child whose OpenMP threads suit the load.

    OpenMP's wait policy can only be set before torch loads, hence the child process when the
    policy the rule chooses (`cory_common.threads.wait_choice`) is not the one in force here.
    """
    wait = wait_choice()
    if SIZES[size][task].threads == 1 or wait.get(POLICY) == policy_in_force():
        build(task, size, out, verbose=verbose)
        return
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **wait, "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "agents.refmodels", "--worker", task, size, str(out)]
    if verbose:
        print(f"[cory lm] build child with {' '.join(f'{k}={v}' for k, v in wait.items())}",
              flush=True)
    else:
        cmd.append("--quiet")
    subprocess.run(cmd, env=env, check=True)


def _lr_lambda(b: LMSize) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to ``min_lr_ratio``."""
    def f(step: int) -> float:
        if step < b.warmup:
            return (step + 1) / b.warmup
        t = (step - b.warmup) / max(1, b.steps - b.warmup)
        return b.min_lr_ratio + (1 - b.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))
    return f


def _new_model(vocab: int, eos: int, b: LMSize):
    from transformers import GPT2Config, GPT2LMHeadModel

    # gelu_pytorch_tanh: GPT-2's tanh GELU as one fused op (HF's default is five Python ops)
    config = GPT2Config(vocab_size=vocab, n_positions=b.n_positions, n_embd=b.n_embd,
                        n_layer=b.n_layer, n_head=b.n_head, activation_function="gelu_pytorch_tanh",
                        resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(b.seed)
    return GPT2LMHeadModel(config)


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
    kw = cache_kwarg(model.transformer)
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
    """Whether this CPU has native bf16 matmuls (then training autocasts to bf16)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def _train(model, seqs: Sequences, b: LMSize, pad: int, log=print) -> dict:
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
    for step, batch in enumerate(batches(seqs, b.batch_size, b.steps, b.seed)):
        ids, mask, weights = pad_rows(seqs, batch, pad, b.prompt_weight)
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


def build(task: str, size: str, out: Path, verbose: bool = True) -> None:
    """Train ``task``'s LM with ``size`` into ``out``; write its report there."""
    log = print if verbose else None
    b = SIZES[size][task]
    with threads(b.threads):
        t0 = time.perf_counter()
        data = TrainingData(task, dict(b.mix))
        seqs = data.sequences(b.steps * b.batch_size, TRAIN_SEED)
        longest = max(len(s) for s in seqs.ids)
        if longest > b.n_positions:
            raise ValueError(f"{task} sequences reach {longest} tokens > {b.n_positions}")
        model = _new_model(len(data.tok), data.eos, b)
        if log:
            n = sum(p.numel() for p in model.parameters())
            log(f"[cory lm] building {task}-{size}: {n / 1e6:.2f}M params, "
                f"{len(seqs.ids)} sequences, data {time.perf_counter() - t0:.1f}s")
        train = _train(model, seqs, b, data.eos, log)

        model.save_pretrained(str(out))
        data.tok.save_pretrained(str(out))
        meta = {"task": task, "size": size, "version": VERSIONS[task],
                "size_settings": asdict(b),
                "train": train, "build_seconds": None}
        (out / "build.json").write_text(json.dumps(meta, indent=1))
        report = build_report(task, out, model=model)
        meta["build_seconds"] = report["build_seconds"] = time.perf_counter() - t0
        (out / "build.json").write_text(json.dumps(meta, indent=1))
        (out / "report.json").write_text(json.dumps(report, indent=1))
        if log:
            log(format_report(report))


def rebuild(task: str, size: str, verbose: bool = True) -> Path:
    """Build anew even if cached: the old folder is moved aside, then removed."""
    remove_dir(model_dir(task, size))
    return reference_lm(task, size=size, verbose=verbose)
