"""Group rollouts: one prompt pass shared by a group's G answers against G passes.

    python tools/perf/group_prefill.py [--batch 64] [--group 8] [--rounds 5] [--threads 2]

On each offline task's reference LM, times the pioneer's prompt pass (`LLMPolicy.begin`) and
its whole turn (`rollout.play_turn`) with the cache shared (`share=True`) and with one pass per
row, interleaved in rounds; prints each median and the within-round ratio as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def measure(task: str, batch: int, group: int, rounds: int) -> dict:
    """Seconds of the prompt pass and the turn, shared vs per row, on one task."""
    import torch

    from agents.llm.policy import LLMPolicy
    from agents.llm.rollout import play_turn
    from agents.refmodels import reference_lm
    from cory_env import BatchedCoryEnv

    policy = LLMPolicy.from_pretrained(str(reference_lm(task)), reference="copy")
    env = BatchedCoryEnv(batch_size=batch, task=task, seed=0)
    times = {k: [] for k in ("prefill_shared", "prefill_rows", "turn_shared", "turn_rows")}
    for _ in range(rounds):
        for share in (True, False):
            env.reset(seed=1, options={"group_size": group})
            obs, P = env.observe(), env.prompt_len
            ids, mask = obs["input_ids"][:, :P], obs["attention_mask"][:, :P]
            g = group if share else 1
            t0 = time.perf_counter()
            policy.begin(ids[::g], mask[::g], max_new_tokens=env.max_new_tokens, repeat=g)
            times[f"prefill_{'shared' if share else 'rows'}"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            play_turn(env, policy, None, torch.Generator().manual_seed(0), share=share)
            times[f"turn_{'shared' if share else 'rows'}"].append(time.perf_counter() - t0)
    out = {k: round(statistics.median(v), 4) for k, v in times.items()}
    for part in ("prefill", "turn"):
        out[f"{part}_rows_over_shared"] = round(statistics.median(
            r / s for r, s in zip(times[f"{part}_rows"], times[f"{part}_shared"])), 2)
    out["prompt_tokens"] = int(env.prompt_len)
    return out


def main(argv=None) -> dict:
    """Measure every offline task; print one JSON line."""
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = {"batch": args.batch, "group": args.group, "threads": args.threads,
              **{t: measure(t, args.batch, args.group, args.rounds)
                 for t in ("sentiment", "arithmetic")}}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
