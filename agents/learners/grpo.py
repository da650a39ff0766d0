"""GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, eq. 3 and section 4.1.2).

Outcome supervision: G answers o_1..o_G to one query with rewards r_i; every token of o_i gets

    A_i = (r_i - mean(r)) / std(r)          (std with Bessel's correction, as TRL's GRPO)

and the loss is the clipped surrogate averaged over each answer's tokens (1/|o_i|), then over the
answers, plus kl_coef * KL(pi || pi_ref) as a loss term with the k3 estimator exp(d) - d - 1,
d = log pi_ref - log pi (`kl.where="reward"`, `--kl-where reward`, puts -kl_coef*KL into the
return instead). A
group whose rewards are all equal has zero advantage (no NaN). No critic.
"""

from __future__ import annotations

from .cory import CORY
from .group import GroupLearner, group_stats
from .registry import register_learner, register_method

EPS = 1e-6


@register_learner("grpo")
class GRPO(GroupLearner):
    """Group-normalised advantages, per-answer length normalisation, KL as a loss."""

    loss_agg = "seq-mean-token-mean"

    def advantages(self, returns, group):
        """(r - group mean) / (group std + eps)."""
        r, mean = group_stats(returns, group)
        return ((r - mean) / (r.std(1, keepdim=True) + EPS)).flatten()


register_method("cory-grpo", "grpo", CORY)  # grpo on CORY's structure
