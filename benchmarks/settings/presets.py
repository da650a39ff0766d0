"""Named benchmark settings: the paper's GPU settings and the offline default.

A preset is a dict of benchmark settings by option name (the names of `python -m
benchmarks.run --help`, with underscores); `config.resolve_config` applies it over the
offline defaults, then `--quick`, then explicit options.
"""

from __future__ import annotations

from agents.learners.ppo_config import KLConfig, PPOConfig

# The paper's IMDB table (Table 1): 256 episodes per iteration and its PPO settings, which are
# PPOConfig's defaults but for these two. Copy with dataclasses.replace, do not mutate it.
IMDB_BATCH = 256
IMDB_PPO = PPOConfig(lr=1.41e-5, mini_batch_size=256)


GSM8K_BATCH = 32  # the paper's GSM8K table (Table 2): episodes per iteration


def gsm8k_ppo(method: str) -> PPOConfig:
    """The paper's GSM8K table (Table 2) for method "cory", "ppo" or "ppo-13b": what differs
    from PPOConfig's defaults (the lr, 2 x 16 accumulated rows, a fixed KL coefficient 0.01)."""
    lrs = {"cory": 1e-4, "ppo": 1e-5, "ppo-13b": 1e-5}
    key = method.lower()
    if key not in lrs:
        raise ValueError(f"method must be one of {tuple(lrs)}, got {method!r}")
    return PPOConfig(lr=lrs[key], mini_batch_size=2, grad_accum_steps=16,
                     kl=KLConfig(coef=0.01, adaptive=False))


def imdb(model: str) -> dict:
    """The paper's IMDB table (Table 1) on GPT-2 with the distilbert-imdb reward model."""
    return dict(tasks=["imdb"], iterations=100, batch_size=IMDB_BATCH,
                mini_batch_size=IMDB_PPO.mini_batch_size, lr=IMDB_PPO.lr, max_new_tokens=16,
                repetition_penalty=1.1, model=model, device="cuda",
                task_options={"reward_model": "lvwerra/distilbert-imdb"}, alone_queries=256,
                eval_every=10, threads=0,
                checkpoint_every=10)  # a GPT-2-Large pair + Adam: ~19 GB a save


def gsm8k() -> dict:
    """The paper's GSM8K table (Table 2): Llama-2-7b-chat, 4-bit + LoRA, per-method lr (its
    batch of 32 and CORY's lr 1e-4 are the defaults)."""
    cory, ppo = gsm8k_ppo("cory"), gsm8k_ppo("ppo")
    return dict(tasks=["gsm8k"], iterations=100, mini_batch_size=cory.mini_batch_size,
                grad_accum_steps=cory.grad_accum_steps, lr_by_method={"ppo": ppo.lr},
                kl_coef=cory.kl.coef, adaptive_kl=cory.kl.adaptive,
                model="meta-llama/Llama-2-7b-chat-hf", lora=True, load_in_4bit=True,
                device="cuda", threads=0, eval_problems=256, eval_samples=4,
                eval_batch_size=32, eval_every=10)  # 1319 x 8 per point would dwarf training


# The offline study: long enough for the claims to be decidable on 2 CPU cores (docs/fidelity.md):
# PPO and CORY, the arms that separate the confounds, and the paper's two ablations.
STUDY = dict(iterations=40, eval_every=4,
             alone_queries=128, methods=["ppo", "cory", "cory-official", "ppo-2x",
                                         "ppo-sampled-kl", "cory-sampled-kl", "cory-no-kt",
                                         "cory-no-re"])

def real(seeds: list[int], methods: tuple[str, ...] = (), iterations: int = 30,
         eval_every: int = 5, alone_queries: int = 128) -> dict:
    """SmolLM2-135M-Instruct on `reviews` at the budget where PPO learns in every seed
    (batch 16 x 30 iterations, lr 5e-4, LoRA r 16, bf16; docs/fidelity.md, "The real model")."""
    return dict(model="smollm2-135m", tasks=["reviews"], seeds=seeds,
                iterations=iterations, batch_size=16, mini_batch_size=16, lr=5e-4, lora=True,
                mixed_precision="bf16", max_new_tokens=12, threads=2,
                **({"methods": list(methods)} if methods else {}),  # else the default pair
                eval_every=eval_every, alone_queries=alone_queries, checkpoint_every=3)


# The real-model study: PPO and CORY, the paper's two ablations and the two arms; 5 seeds,
# 11 alone-evaluation points of 256 held-out queries. Runs with --resume across sittings.
REAL = real([0, 1, 2, 3, 4], ("ppo", "cory", "cory-no-kt", "cory-no-re", "cory-official",
                              "ppo-2x"), eval_every=3, alone_queries=256)

# Claim (2) on the real model: the same budget on `reasoning` (reasoning-gym's one-digit
# arithmetic, exact match), every held-out problem (69) sampled 4 times at each of 11 points.
REAL_MATH = {**real([0, 1, 2, 3, 4], eval_every=3), "tasks": ["reasoning"],
             "max_new_tokens": 8, "eval_problems": 69, "eval_samples": 4}

# The allocation a comparison on SmolLM2 buys its interval with (docs/performance.md, "Where a
# study's time should go", from `python -m benchmarks.allocate`): the seeds, not the evaluation,
# set the width, so 5 points of 64 openings and more seeds (fresh ones, from 100) keep the
# factor study's width at 0.67x its CPU-hours on `reviews`, and 6 seeds of 5 points on 17
# problems (x 4 samples) at 0.53x on `reasoning`.
LEADERBOARD = {k: v for k, v in real(list(range(100, 112)), eval_every=6).items()
               if k != "alone_queries"}  # the default's 64 openings
LEADERBOARD_MATH = {**real(list(range(100, 106)), eval_every=6), "tasks": ["reasoning"],
                    "max_new_tokens": 8, "eval_problems": 17, "eval_samples": 4}

# name -> settings over the offline defaults (the "offline" preset is the defaults).
PRESETS: dict[str, dict] = {
    "offline": {},
    "study": STUDY,
    "quick": {"quick": True},
    "imdb": imdb("gpt2-large"),
    "imdb-xl": {**imdb("gpt2-xl"), "methods": ["ppo"]},  # the paper's size ablation for single PPO
    "gsm8k": gsm8k(),
    "real": REAL,
    "real-math": REAL_MATH,
    "real-demo": real([0]),  # make demo's comparison: one seed, about 10 minutes on 2 cores
    "leaderboard": LEADERBOARD,
    "leaderboard-math": LEADERBOARD_MATH,
}
