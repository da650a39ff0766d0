"""RLOO: REINFORCE with a leave-one-out baseline (Kool et al. 2019, "Buy 4 REINFORCE samples,
get a baseline for free"; Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740).

Each answer's baseline is the mean return of the other G - 1 answers to the same query:

    A_i = R_i - (sum_j R_j - R_i) / (G - 1) = G / (G - 1) * (R_i - mean(R))

with the sequence-level return R_i = score_i - kl_coef * sum_t KL_t (the KL in the reward, as in
the paper). The policy loss is the clipped surrogate (one epoch with no clipping is plain
REINFORCE). No critic.
"""

from __future__ import annotations

from .cory import CORY
from .group import GroupLearner, group_stats
from .registry import register_learner, register_method


@register_learner("rloo")
class RLOO(GroupLearner):
    """Leave-one-out baseline over each query's G answers; KL in the reward."""

    kl_where, kl_where_fixed = "reward", True

    def advantages(self, returns, group):
        """R_i minus the mean of the group's other returns."""
        r, _ = group_stats(returns, group)
        return (r - (r.sum(1, keepdim=True) - r) / (group - 1)).flatten()


register_method("cory-rloo", "rloo", CORY)  # rloo on CORY's structure
