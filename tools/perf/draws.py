"""Drawing a token from the vocabulary: one float32 running sum against the two-level sampler.

    python tools/perf/draws.py                       # both real models, 2 threads
    python tools/perf/draws.py --models smollm2-135m --threads 1

`single` is the inverse-CDF draw over one float32 running sum of the whole row (the sampler
before the two-level one); `two-level` is `agents.llm.sampling.sample_from_logprobs` (blocks of
256 entries, float64 sums). Per model, in one process: the next-token log-probs of the study's
first turn (64 held-out `reviews` openings, the base model), then
- each sampler's time for one draw of the 64 rows (median of --rounds, the two alternated);
- the total variation between the distribution each sampler draws from and the model's (the
  gaps of its running sum against a float64 one: what its rounding moves), and the share of
  draws that land elsewhere than a float64 inverse CDF's under the same u (a coupling, not an
  error: boundaries all shifted by a hair move draws without changing the distribution).
The last line is one JSON object.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from decode_limit import model_parser, per_model  # noqa: E402


def single(logp, generator):
    """The float32 single running-sum inverse CDF (the earlier sampler), for comparison."""
    import torch

    cdf = logp.exp().cumsum(-1)
    u = torch.rand(cdf.shape[0], 1, generator=generator, dtype=cdf.dtype)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return token.squeeze(-1).clamp(max=cdf.shape[-1] - 1)


def strays(logp, sampler) -> tuple[float, float]:
    """(mean total variation of the drawn distribution from the model's, share of draws that
    differ from a float64 inverse CDF's), over 100 draws of every row."""
    import torch
    import torch.nn.functional as F

    from agents.llm.sampling import BLOCK, sample_from_logprobs

    p = logp.double().exp()
    p = p / p.sum(-1, keepdim=True)
    cdf = p.cumsum(-1)
    if sampler == "single":  # entry j is drawn for u in its float32 running sum's gap
        c = logp.exp().cumsum(-1).double()
        drawn = torch.diff(c, dim=-1, prepend=torch.zeros(len(c), 1, dtype=c.dtype)) / c[:, -1:]
    else:  # each block gets its float32 sum's width, its entries their float64 sums in it
        q = F.pad(logp.exp(), (0, -logp.shape[-1] % BLOCK)).view(len(logp), -1, BLOCK)
        width = q.sum(-1).double()[..., None]
        inner = q.double().cumsum(-1)
        drawn = torch.diff(torch.minimum(inner, width), dim=-1,
                           prepend=torch.zeros_like(inner[..., :1]))
        last = torch.where(q > 0, torch.arange(BLOCK), -1).amax(-1, True)  # takes any excess
        drawn.scatter_add_(-1, last, (width - inner[..., -1:]).clamp(min=0))
        drawn = drawn.flatten(1)[:, :logp.shape[-1]] / width.sum(1)
    tv = float((0.5 * (drawn.clamp(min=0) - p).abs().sum(-1)).mean())
    draw = single if sampler == "single" else sample_from_logprobs
    differ = 0
    for seed in range(100):
        token = draw(logp, torch.Generator().manual_seed(seed))
        u = torch.rand(len(logp), 1, generator=torch.Generator().manual_seed(seed)).double()
        want = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
        differ += int((token != want).sum())
    return tv, differ / (100 * len(logp))


def measure(model: str, threads: int, rounds: int) -> dict:
    """One model's figures (run in a child process)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    from agents.llm.policy import LLMPolicy
    from agents.llm.sampling import sample_from_logprobs
    from cory_common.pretrained import load_tokenizer, resolve_model
    from cory_env import BatchedCoryEnv, make_task

    policy = LLMPolicy.from_pretrained(resolve_model(model), mixed_precision="bf16")
    env = BatchedCoryEnv(batch_size=64, task=make_task("reviews"), max_new_tokens=12,
                         tokenizer=load_tokenizer(model), split="test", n_agents=1, seed=0)
    env.reset(options={"queries": list(range(64))})
    obs = env.observe(env.possible_agents[0])
    state = policy.begin(obs["input_ids"], obs["attention_mask"], max_new_tokens=12)
    logp = F.log_softmax(state.logits.float(), -1)
    times = {"single": [], "two-level": []}
    for r in range(rounds + 1):
        for name, draw in (("single", single), ("two-level", sample_from_logprobs)):
            t0 = time.perf_counter()
            draw(logp, torch.Generator().manual_seed(r))
            if r:  # the first round warms up
                times[name].append(1e3 * (time.perf_counter() - t0))
    row = {"model": model, "threads": threads, "vocab": logp.shape[-1], "rows": len(logp)}
    for name, t in times.items():
        tv, differ = strays(logp, name)
        row[name] = {"draw_ms": round(statistics.median(t), 2), "total_variation": tv,
                     "differs_from_float64": differ}
    row["speedup"] = round(row["single"]["draw_ms"] / row["two-level"]["draw_ms"], 2)
    return row


def main() -> None:
    """Measure each model in its own process; print the JSON line."""
    p = model_parser(__doc__, decode=False)
    p.add_argument("--rounds", type=int, default=30, help="timed draws of each sampler")
    per_model(__file__, p, measure)


if __name__ == "__main__":
    main()
