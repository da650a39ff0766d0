"""PPO variants that separate the confounds of a PPO-vs-CORY comparison, one name per arm.

* `ppo-official` (the method `cory-official` is it on CORY's structure): PPO as the official
  IMDB code runs it: score scaling and normalisation, initial KL coefficient 0.4 (adaptive runs),
  repetition penalty 1.1, and every batch's answer length drawn once from
  [4, max_new_tokens - 1] (its `LengthSampler(4, 16)`);
* `ppo-2x`: PPO with CORY's sample budget, twice the episodes per iteration (as many
  optimizer steps, each on twice the rows);
* `ppo-sampled-kl` (and `cory-sampled-kl`): the sampled log-ratio as the KL reward instead of
  whatever the KL penalty says (the paper's code uses the full KL, which gives no direct pull
  back toward the reference).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..llm.sampling import SamplingConfig
from .cory import CORY
from .ppo_config import PPOConfig
from .ppo_learner import PPO
from .registry import register_learner, register_method

OFFICIAL_MIN_TOKENS = 4  # the official code's LengthSampler(4, 16)


def drawn_length(seed: int, iteration: int, max_new_tokens: int) -> int:
    """The answer length of one batch: uniform on [4, T - 1] (T <= 4: T), from (seed, iteration)."""
    low = min(OFFICIAL_MIN_TOKENS, max_new_tokens)
    high = max(low, max_new_tokens - 1)
    return int(np.random.default_rng([seed, iteration]).integers(low, high + 1))


@register_learner("ppo-official")
class PPOOfficial(PPO):
    """PPO with the official CORY code's own settings (see the module docstring)."""

    max_new_tokens: int | None = None  # the env's T, from `attach`

    def attach(self, env) -> None:
        """Remember the env's answer cap T (the drawn lengths stay below it)."""
        self.max_new_tokens = env.max_new_tokens

    def agent_config(self, agent: str) -> PPOConfig:
        """Score scaling + normalisation; the KL coefficient starts at 0.4 when it adapts."""
        ppo = replace(super().agent_config(agent), use_score_scaling=True, use_score_norm=True)
        return replace(ppo, kl=replace(ppo.kl, coef=0.4)) if ppo.kl.adaptive else ppo

    @property
    def sampling(self) -> SamplingConfig:
        """The official code's repetition penalty 1.1."""
        return replace(self.cfg.sampling, repetition_penalty=1.1)

    def reset_options(self, iteration: int) -> dict:
        """The structure's schedule plus one answer length per batch."""
        out = super().reset_options(iteration)
        if self.max_new_tokens is not None:
            out["max_new_tokens"] = drawn_length(self.seed, iteration, self.max_new_tokens)
        return out


@register_learner("ppo-2x")
class PPODoubleBatch(PPO):
    """PPO with twice the episodes per iteration: CORY's sample budget."""

    batch_multiplier = 2


@register_learner("ppo-sampled-kl")
class PPOSampledKL(PPO):
    """PPO with the sampled log-ratio as the per-token KL reward."""

    def agent_config(self, agent: str) -> PPOConfig:
        """The KL penalty "kl" (the sampled log-ratio)."""
        ppo = super().agent_config(agent)
        return replace(ppo, kl=replace(ppo.kl, penalty="kl"))


register_method("cory-official", "ppo-official", CORY)
register_method("cory-sampled-kl", "ppo-sampled-kl", CORY)
