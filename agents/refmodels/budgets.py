"""The build presets of the offline reference LMs: model size, optimisation and evaluation."""

from __future__ import annotations

from dataclasses import dataclass


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
