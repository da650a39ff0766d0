"""The offline reference LMs' recipes: per task, its version, training mix and build presets
(model size, optimisation and evaluation); the task's tokenizer recipe is in
`cory_env/data/tokenizer.py`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LMSize:
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
    mix: tuple = ()  # overrides of the recipe's mix, as (key, value) pairs
    threads: int = 1  # fixed, so the numerics (and so the weights) do not depend on the machine
    seed: int = 0


@dataclass(frozen=True)
class LMRecipe:
    """One offline task's reference LM: a version to bump when its data, model or training
    change (old caches are then ignored), the shares of its training sequences, and its build
    presets by size name ("full" is the real default, "tiny" is for tests: seconds, the same
    code path)."""

    version: str
    mix: dict
    sizes: dict


_TINY = LMSize(n_layer=2, n_embd=48, n_head=2, steps=40, batch_size=16, lr=1e-2, warmup=5,
               n_heldout=32, eval_episodes=8, n_samples=2)
# The mix: shares of the training sequences, "observer" sequences (the rest are pioneer ones);
# sentiment's "fresh": the share of observer sequences whose rewrite is another positive
# review's continuation of the same prefix (when one exists) instead of the positivised copy;
# arithmetic's "right_reference": the share of observer sequences whose reference is right.
RECIPES = {
    "sentiment": LMRecipe("v3", {"observer": 0.3, "fresh": 0.0}, {
        "full": LMSize(n_layer=4, n_embd=128, n_head=4, steps=600, batch_size=48, lr=5e-3,
                       warmup=40, threads=2, mix=(("observer", 0.6),)),
        "tiny": _TINY}),
    "arithmetic": LMRecipe("v5", {"observer": 0.75, "right_reference": 0.5}, {
        "full": LMSize(n_layer=4, n_embd=128, n_head=4, steps=1800, batch_size=12, lr=4e-3,
                       warmup=60, threads=2, prompt_weight=0.2, eval_episodes=512),
        "tiny": _TINY}),
}
# Views of the recipes: SIZES[name][task], VERSIONS[task], MIXES[task].
SIZES = {name: {task: r.sizes[name] for task, r in RECIPES.items()}
           for name in ("full", "tiny")}
VERSIONS = {task: r.version for task, r in RECIPES.items()}
MIXES = {task: r.mix for task, r in RECIPES.items()}
