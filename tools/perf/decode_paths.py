"""The exact and the fast decode paths, one against the other in one process, per real model.

    python tools/perf/decode_paths.py                          # both real models
    python tools/perf/decode_paths.py --models smollm2-135m --rounds 3

In one process per model (the study's policy: LoRA r 16, bf16 autocast), alternating the two
paths `--rounds` times: a cached decode step at batch 16 against its streaming limit (the
weights' bf16 bytes over the copy bandwidth measured in the same process, as
`decode_limit.py`), and the study's alone evaluation (`answer_alone`: --alone held-out
`reviews` openings in batches of 64, 12 new tokens, rewards and KLs), split into its phases
(the prompt passes, the decode steps, the draws, the reference pass, the trained model's pass,
the KL over the vocabulary), and how far the two paths' distributions are apart on the same
tokens (`agreement`). `alone_floor_s` is the fast path's evaluation with its decode
steps at the streaming limit and every other phase as measured: the most its decode steps can
give. Medians over the rounds; the last line is one JSON object.
"""

from __future__ import annotations

import importlib
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from decode_limit import copy_bandwidth, decode_times, model_parser, per_model  # noqa: E402

PHASES = (("agents.llm.policy", "LLMPolicy.begin", "prompt passes"),
          ("agents.llm.policy", "LLMPolicy.feed", "decode steps"),
          ("agents.llm.decoding", "draw", "draws"),
          ("agents.llm.policy", "LLMPolicy.reference_logits", "reference pass"),
          ("agents.llm.policy", "LLMPolicy.evaluate", "trained model's pass"),
          ("agents.llm.rollout", "kl_to_reference", "KL over the vocabulary"))


@contextmanager
def timed_phases(acc: dict):
    """While inside, add each phase's seconds and calls to `acc` ({name: [s, calls]})."""
    patched = []
    for module, path, name in PHASES:
        *parents, attr = path.split(".")
        owner = importlib.import_module(module)
        for part in parents:
            owner = getattr(owner, part)
        f = getattr(owner, attr)

        def timed(*a, _f=f, _name=name, **k):
            t0 = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                acc[_name][0] += time.perf_counter() - t0
                acc[_name][1] += 1
        patched.append((owner, attr, f, attr in vars(owner)))
        setattr(owner, attr, timed)
    try:
        yield
    finally:
        for owner, attr, f, own in patched:
            setattr(owner, attr, f) if own else delattr(owner, attr)


def agreement(policy, ids, steps: int = 12) -> dict:
    """The two paths on the same tokens (each drawn from the exact path's distribution, then fed
    to both): the share of steps whose most likely token agrees, and the per-token KL from the
    fast path's distribution to the exact one (mean, largest) and |log-prob gap| of the drawn
    token (mean, largest)."""
    import torch

    from agents.llm.engine import DecodeEngine

    engine, gen = policy.engine or DecodeEngine(policy), torch.Generator().manual_seed(0)
    policy.engine = None
    mask = torch.ones_like(ids)
    exact = policy.begin(ids, mask, max_new_tokens=steps)
    fast = engine.begin(ids, mask, max_new_tokens=steps)
    same, kls, gaps = [], [], []
    for _ in range(steps):
        le, lf = exact.logits.float().log_softmax(-1), fast.logits.float().log_softmax(-1)
        token = torch.multinomial(le.exp(), 1, generator=gen).squeeze(1)
        same.append((le.argmax(-1) == lf.argmax(-1)).float())
        kls.append((lf.exp() * (lf - le)).sum(-1))
        gaps.append((le - lf).gather(1, token[:, None]).squeeze(1).abs())
        policy.feed(exact, token)
        engine.feed(fast, token)
    policy.engine = engine
    kl, gap = torch.cat(kls), torch.cat(gaps)
    return {"argmax_agreement": round(float(torch.cat(same).mean()), 4),
            "kl_mean": float(f"{kl.mean():.3g}"), "kl_max": float(f"{kl.max():.3g}"),
            "logprob_gap_mean": float(f"{gap.mean():.3g}"),
            "logprob_gap_max": float(f"{gap.max():.3g}")}


def measure(model: str, threads: int, steps: int, alone: int, rounds: int) -> dict:
    """One model's figures (run in a child process)."""
    import torch

    torch.set_num_threads(threads)
    from agents.llm.engine import attach
    from agents.llm.loading import LoraSettings
    from agents.llm.policy import LLMPolicy
    from agents.llm.rollout import answer_alone
    from agents.llm.sampling import SamplingConfig
    from cory_common.pretrained import load_tokenizer, resolve_model
    from cory_env import BatchedCoryEnv, make_task

    policy = LLMPolicy.from_pretrained(resolve_model(model), lora=LoraSettings(r=16),
                                       mixed_precision="bf16")
    for name, p in policy.model.named_parameters():  # a trained-looking adapter
        if "lora_B" in name:
            p.data.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    bf16 = sum(p.numel() * 2 for p in policy.hf_model.parameters())
    limit = bf16 / copy_bandwidth()
    env = BatchedCoryEnv(batch_size=64, task=make_task("reviews"), max_new_tokens=12,
                         tokenizer=load_tokenizer(model), split="test",
                         n_agents=1, seed=0)
    queries = list(range(min(alone, len(env.task.queries("test")))))
    out = {p: {"step_ms": [], "alone_s": [], "alone_kl": None, "alone_reward": None,
               "phases": defaultdict(list), "steps": 0} for p in ("exact", "fast")}
    for _ in range(rounds):
        for path in ("exact", "fast"):
            attach(policy, path)
            out[path]["step_ms"].append(1e3 * statistics.median(decode_times(policy, 16,
                                                                             steps)))
            acc = defaultdict(lambda: [0.0, 0])
            t0 = time.perf_counter()
            with timed_phases(acc):
                rewards, kls = answer_alone(env, policy, SamplingConfig(),
                                            torch.Generator().manual_seed(0), queries)
            out[path]["alone_s"].append(time.perf_counter() - t0)
            for name, (seconds, _) in acc.items():
                out[path]["phases"][name].append(seconds)
            out[path]["steps"] = acc["decode steps"][1]
            out[path]["alone_kl"] = round(float(kls.mean()), 5)
            out[path]["alone_reward"] = round(float(rewards.mean()), 4)
    row = {"model": model, "threads": threads, "weights_MB_bf16": round(bf16 / 1e6),
           "limit_ms": round(1e3 * limit, 1), "queries": len(queries)}
    for path, r in out.items():
        row[path] = {"step_ms": round(statistics.median(r["step_ms"]), 1),
                     "step_over_limit": round(statistics.median(r["step_ms"]) / 1e3 / limit, 2),
                     "alone_s": round(statistics.median(r["alone_s"]), 2),
                     "alone_reward": r["alone_reward"], "alone_kl": r["alone_kl"],
                     "alone_phases_s": {k: round(statistics.median(v), 2)
                                        for k, v in r["phases"].items()},
                     "alone_decode_steps": r["steps"]}
    fast = out["fast"]
    floor = (statistics.median(fast["alone_s"]) - statistics.median(fast["phases"]["decode steps"])
             + fast["steps"] * limit)
    row["alone_floor_s"] = round(floor, 2)
    row["alone_speedup_at_limit"] = round(row["exact"]["alone_s"] / floor, 2)
    row["step_speedup"] = round(row["exact"]["step_ms"] / row["fast"]["step_ms"], 2)
    row["alone_speedup"] = round(row["exact"]["alone_s"] / row["fast"]["alone_s"], 2)
    attach(policy, "fast")
    tokenizer = load_tokenizer(model)
    texts = [q.text for q in env.task.queries("test")]
    rows = [r for r in (tokenizer(t)["input_ids"] for t in texts) if len(r) >= 6][:64]
    row["agreement"] = agreement(policy, torch.tensor([r[:6] for r in rows]))
    return row


def main() -> None:
    """Measure each model in its own process; print the JSON line."""
    p = model_parser(__doc__)
    p.add_argument("--rounds", type=int, default=2, help="alternations of the two paths")
    per_model(__file__, p, measure)


if __name__ == "__main__":
    main()
