"""Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv 2503.20783): GRPO without its two biases.

    A_i = r_i - mean(r)                     (no division by the group's std)

and the clipped surrogate is summed over each answer's tokens and divided by a constant (the
response width T = max_new_tokens) rather than by the answer's own length |o_i|, then
averaged over the answers. The KL term is GRPO's (k3 loss by default). No critic.
"""

from __future__ import annotations

from .cory import CORY
from .group import GroupLearner, group_stats
from .registry import register_learner, register_method


@register_learner("dr-grpo")
class DrGRPO(GroupLearner):
    """Group-mean baseline, no std division, no per-answer length normalisation."""

    loss_agg = "seq-mean-token-sum"

    def advantages(self, returns, group):
        """r - group mean."""
        r, mean = group_stats(returns, group)
        return (r - mean).flatten()


register_method("cory-dr-grpo", "dr-grpo", CORY)  # dr-grpo on CORY's structure
