"""PPO's settings, shared by every learner's update: `PPOConfig` (epochs, clipping, the value
loss, GAE, mini-batches) and `KLConfig`, the KL coefficient to the frozen reference and
everything about it. Defaults are the paper's IMDB PPO table (docs/learners.md, "Defaults").

Every learner's update runs the clipped loss of `agents.learners.ppo`, so `LearnerConfig.ppo`
holds one of these for any learner; the PPO learner itself is `agents.learners.ppo_learner`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from cory_common.checks import check_fields, check_int, meta

from .credit import CREDITS

KL_PENALTIES = ("kl", "abs", "mse", "full")
KL_WHERE = ("reward", "loss")
KL_LOSS_ESTIMATORS = ("k1", "k2", "k3")
OLD_LOGPROBS = ("auto", "sampler", "recompute")
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


@dataclass
class KLConfig:
    """The KL coefficient to the frozen reference (`kl.coef`, the paper's eta): its value, its
    controller, its per-token estimator and where it acts (TRL's adaptive controller by
    default)."""

    coef: float = field(default=0.3, metadata=meta(
        "KL coefficient (the first value, if adaptive)", flag="kl-coef"))
    adaptive: bool = field(default=True, metadata=meta(
        "adapt the KL coefficient toward the KL target", flag="adaptive-kl"))
    target: float = field(default=6.0, metadata=meta("adaptive KL target (nats)",
                                                     flag="kl-target"))
    horizon: float = field(default=10000, metadata=meta("adaptive KL horizon (samples)",
                                                        flag="kl-horizon"))
    scale_horizon: bool = field(default=True, metadata=meta(
        "use horizon x batch_size / 256: the paper's coefficient step per iteration at any batch",
        flag="scale-kl-horizon"))
    penalty: str = field(default="full", metadata=meta(
        "per-token KL of the reward: kl | abs | mse | full", flag="kl-penalty"))
    where: str | None = field(default=None, metadata=meta(
        "where kl_coef acts: reward | loss (none: the learner's own; reward for PPO, loss for "
        "grpo and dr-grpo)", flag="kl-where"))
    loss_estimator: str = field(default="k3", metadata=meta(
        "k1 | k2 | k3 (the KL as a loss)", flag="kl-loss-estimator"))

    def validate(self) -> KLConfig:
        """Raise ValueError naming the first invalid field; return self otherwise."""
        check_fields(self)
        for name in ("target", "horizon"):
            if not getattr(self, name) > 0:  # also rejects NaN
                raise ValueError(f"KLConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if not (self.coef >= 0 and math.isfinite(self.coef)):
            raise ValueError(f"KLConfig.coef must be a finite number >= 0, got {self.coef!r}")
        for name, allowed in (("penalty", KL_PENALTIES), ("where", (*KL_WHERE, None)),
                              ("loss_estimator", KL_LOSS_ESTIMATORS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"KLConfig.{name} must be one of {allowed}, got "
                                 f"{getattr(self, name)!r}")
        return self


@dataclass
class PPOConfig:
    """Hyperparameters of token-level PPO (TRL-style names). The defaults are every run's, the
    one source of them: the paper's IMDB table (Table 1: 4 epochs, clip 0.2, vf 0.1, gamma 1,
    lambda 0.95, the full KL from 0.3, adaptive toward 6 nats) except lr 1e-4 and a 32-row
    mini-batch, since the offline default of 20 x 32 episodes is ~40x fewer samples than its
    100 x 256; the KL horizon scales with the batch, so the coefficient moves per iteration as
    fast as in its batch-256 runs. Presets state only what differs (`benchmarks.settings.presets`).

    As in TRL, ``mini_batch_size`` is the size of one forward/backward pass and
    one optimizer step covers ``mini_batch_size * grad_accum_steps`` samples.
    ``max_tokens_per_pass`` also caps a pass by tokens (rows x unpadded width): an optimizer
    step's rows are sorted by length and packed into passes under the cap, so long sequences
    take more, smaller passes (less activation memory) and similar lengths share one.
    Single-process only: ranks would run different numbers of passes.

    ``old_logprobs`` says where the old log-probs and values come from. "sampler" and "auto"
    (default): the rollout's own: from the pass that drew each token, or, where decoding's
    numerics differ from a full pass (a 4-bit base, mixed precision), from the no-grad full
    pass the rollout then makes (`agents.llm.rollout.full_pass`). "recompute": one extra no-grad
    pass over the batch in the learner first, as TRL does.
    """

    lr: float = field(default=1e-4, metadata=meta("learning rate"))
    ppo_epochs: int = field(default=4, metadata=meta("PPO epochs per iteration"))
    mini_batch_size: int = field(default=32, metadata=meta("rows of one forward/backward pass"))
    grad_accum_steps: int = field(default=1, metadata=meta("passes per optimizer step"))
    cliprange: float = field(default=0.2, metadata=meta("policy ratio clip"))
    cliprange_value: float = field(default=0.2, metadata=meta("value clip"))
    vf_coef: float = field(default=0.1, metadata=meta("value-loss weight"))
    gamma: float = field(default=1.0, metadata=meta("discount"))
    lam: float = field(default=0.95, metadata=meta("GAE lambda"))
    credit: str = field(default="episode", metadata=meta(
        "rounds > 1: GAE across an agent's turns (episode) or each turn alone (turn)"))
    kl: KLConfig = field(default_factory=KLConfig)
    whiten_advantages: bool = field(default=True, metadata=meta("whiten advantages"))
    use_score_scaling: bool = field(default=False, metadata=meta("divide scores by their std"))
    use_score_norm: bool = field(default=False, metadata=meta("also subtract their mean"))
    score_clip: float | None = field(default=None, metadata=meta("clip scores to +-this"))
    max_grad_norm: float | None = field(default=1.0, metadata=meta("gradient clip norm"))
    early_stop_kl: float | None = field(default=None, metadata=meta(
        "stop the epochs once approx-KL exceeds this"))
    ratio_threshold: float = field(default=10.0, metadata=meta(
        "skip a minibatch whose mean ratio exceeds this"))
    entropy_coef: float = field(default=0.0, metadata=meta("entropy bonus weight"))
    loss_agg: str = field(default="token-mean", metadata=meta(
        "token-mean | seq-mean-token-mean (GRPO) | seq-mean-token-sum (Dr. GRPO)"))
    max_tokens_per_pass: int | None = field(default=None, metadata=meta(
        "cap on tokens (rows x unpadded width) of one training pass"))
    old_logprobs: str = field(default="auto", metadata=meta(
        "old log-probs and values: auto | sampler | recompute"))
    tis_cap: float = field(default=2.0, metadata=meta(
        "cap of the truncated importance weight pi_trainer / pi_sampler of each token, "
        "applied when the fast decode path sampled it"))

    def __post_init__(self) -> None:
        self.validate()

    def kl_horizon(self, batch_size: int) -> float:
        """The adaptive controller's horizon: kl.horizon, scaled to the batch if asked."""
        return self.kl.horizon * (batch_size / 256 if self.kl.scale_horizon else 1.0)

    @property
    def backward_batch_size(self) -> int:
        """Samples per optimizer step: mini_batch_size * grad_accum_steps."""
        return self.mini_batch_size * self.grad_accum_steps

    def validate(self) -> PPOConfig:
        """Raise ValueError naming the first invalid field; return self otherwise."""
        check_fields(self)

        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"PPOConfig.{name} {rule}, got {getattr(self, name)!r}")

        for name in ("ppo_epochs", "mini_batch_size", "grad_accum_steps"):
            check_int(f"PPOConfig.{name}", getattr(self, name), 1)
        for name in ("lr", "cliprange", "cliprange_value", "ratio_threshold", "tis_cap"):
            if not getattr(self, name) > 0:  # also rejects NaN
                raise bad(name, "must be > 0")
        for name in ("vf_coef", "entropy_coef"):
            if not getattr(self, name) >= 0:
                raise bad(name, "must be >= 0")
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise bad(name, "must be in [0, 1]")
        check_int("PPOConfig.max_tokens_per_pass", self.max_tokens_per_pass, 1, none_ok=True)
        for name in ("score_clip", "max_grad_norm", "early_stop_kl"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise bad(name, "must be None or > 0")
        if not isinstance(self.kl, KLConfig):
            raise bad("kl", "must be a KLConfig")
        self.kl.validate()
        for name, allowed in (("loss_agg", LOSS_AGGS), ("old_logprobs", OLD_LOGPROBS),
                              ("credit", CREDITS)):
            if getattr(self, name) not in allowed:
                raise bad(name, f"must be one of {allowed}")
        return self
