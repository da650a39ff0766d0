"""Exercise 2 (solution): your own learner, REINFORCE with a moving-average baseline.

Run: python -m examples.exercises.ex2_learner
"""

from __future__ import annotations

import tempfile
from dataclasses import replace

from agents.learners.cory import CORY
from agents.learners.learner import Learner
from agents.learners.registry import register_learner, register_method
from agents.training.train import Trainer
from cory_common import cli

from .common import course_config, course_lm


@register_learner("reinforce-ema")  # the method reinforce-ema: the learner on one agent
class ReinforceEMA(Learner):
    """REINFORCE: advantage = return - moving average of past returns; no critic."""

    decay = 0.9
    saved_state = ("baseline",)  # the running baseline is part of a checkpoint

    def __init__(self, policies, cfg, seed=0, **kwargs):
        super().__init__(policies, cfg, seed, **kwargs)
        self.baseline = {name: None for name in policies}

    def agent_config(self, agent):
        """No critic, so no value loss."""
        return replace(super().agent_config(agent), vf_coef=0.0)

    def update(self, turns, iteration):
        """Sequence-level advantages against each agent's running baseline."""
        stats = {}
        for name, turn in turns.items():
            agent = self.agents[name]
            batch = agent.batch(turn)
            returns = batch.rewards.sum(1)
            base = self.baseline[name]
            base = returns.mean() if base is None else base
            batch.advantages = (returns - base)[:, None] * turn.response_mask
            batch.returns = returns[:, None] * turn.response_mask
            self.baseline[name] = self.decay * base + (1 - self.decay) * returns.mean()
            stats[name] = agent.learn(batch, turn, self.generator)
        return stats


register_method("cory-reinforce-ema", "reinforce-ema", CORY)  # the same on CORY's structure


def main(argv=None) -> list[float]:
    """Train cory-reinforce-ema (the learner on CORY's structure) on the colours task; print
    and return llm_0's reward curve."""
    p = cli.Parser("python -m examples.exercises.ex2_learner", description=__doc__)
    p.add_argument("--iterations", type=int, default=8)
    args = p.parse_args(argv)
    tmp = tempfile.TemporaryDirectory(prefix="course-lm-")
    model = course_lm(tmp.name)
    curve = [m["llm_0"]["task_reward"] for m in
             Trainer(course_config("cory-reinforce-ema", model, args.iterations)).run()]
    print(f"first={curve[0]:.3f} last={curve[-1]:.3f}")
    tmp.cleanup()
    return curve


if __name__ == "__main__":
    main()
