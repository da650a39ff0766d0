"""Exercise 3 (solution): collective, individual and difference rewards.

Difference rewards (Wolpert & Tumer) pay agent i  D_i = G(z) - G(z with i's part replaced by a
default). CORY's team reward is additive, G = r_pio + r_obs; with the default "an average
answer" (the batch mean of r_i), D_i = r_i - mean(r_i): the other agent's noise drops out of
agent i's credit, while the collective reward keeps it.

Run: python -m examples.exercises.ex3_rewards
"""

from __future__ import annotations

import tempfile

import torch

from agents.learners.ppo_learner import PPO
from agents.learners.registry import register_learner
from agents.training.train import Trainer
from cory_common import cli

from .common import course_config, course_lm


def difference_rewards(own: torch.Tensor, collective: torch.Tensor) -> torch.Tensor:
    """D_i = G - G_{-i} with agent i's reward replaced by its batch mean."""
    counterfactual = collective - own + own.mean()
    return collective - counterfactual


@register_learner("ippo-difference")
class DifferencePPO(PPO):
    """PPO for each agent on the collective-reward env, each paid its difference reward."""

    def update(self, turns, iteration):
        """Swap each turn's env reward for its difference reward, then run PPO."""
        collective = sum(t.task_reward for t in turns.values())
        for turn in turns.values():
            turn.reward = difference_rewards(turn.task_reward, collective)
        return super().update(turns, iteration)


def main(argv=None) -> dict[str, float]:
    """Train cory, cory-individual and ippo-difference; print the final collective reward."""
    p = cli.Parser("python -m examples.exercises.ex3_rewards", description=__doc__)
    p.add_argument("--iterations", type=int, default=8)
    args = p.parse_args(argv)
    tmp = tempfile.TemporaryDirectory(prefix="course-lm-")
    model = course_lm(tmp.name)
    out = {}
    for method in ("cory", "cory-individual", "ippo-difference"):
        last = list(Trainer(course_config(method, model, args.iterations)).run())[-1]
        out[method] = last["llm_0"]["collective_reward"]
        print(f"{method:16s} collective reward {out[method]:.3f}")
    tmp.cleanup()
    return out


if __name__ == "__main__":
    main()
