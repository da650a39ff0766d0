"""One LLM's learning state, `PPOAgent`: its policy, Adam, KL controller and score statistics,
and the path of the KL coefficient through one update: shape a turn into per-token rewards
(`batch`: the score, minus kl_coef x the KL per token, `agents.learners.shaping`), run PPO on
them (`learn`: `agents.learners.ppo.ppo_update`), then move kl_coef from this batch's KL.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..llm.rollout import Turn
from ..llm.sampling import SamplingConfig
from .comm import Comm
from .ppo import (
    PPOBatch,
    kl_per_token,
    ppo_update,
)
from .ppo_config import PPOConfig
from .shaping import (
    RunningMoments,
    make_kl_controller,
    scale_scores,
    token_rewards,
    truncated_is_weights,
)


def adam(params, lr: float) -> torch.optim.Adam:
    """Adam, using the fused kernel where every parameter lives on a device that has one."""
    params = list(params)
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda")
                                 for p in params)
    return torch.optim.Adam(params, lr=lr, fused=fused or None)


class PPOAgent:
    """One LLM's learning state: policy, Adam, KL controller and running score statistics.

    `policy` is what training passes go through (`comm.prepare` of the rollout's policy); the
    KL controller and the score statistics see the global batch through `comm`.
    """

    def __init__(self, policy, cfg: PPOConfig, batch_size: int,
                 sampling: SamplingConfig | None = None, comm: Comm | None = None):
        self.comm = comm or Comm()
        self.policy, self.cfg, self.sampling = self.comm.prepare(policy), cfg, sampling
        self.optimizer = adam(self.policy.trainable_parameters(), cfg.lr)
        self.kl_controller = make_kl_controller(cfg, batch_size)
        self.score_stats = RunningMoments()

    @property
    def kl_coef(self) -> float:
        """The current KL coefficient."""
        return float(self.kl_controller.coef)

    def penalty(self, turn: Turn) -> torch.Tensor:
        """The per-token KL estimate chosen by cfg.kl.penalty, masked."""
        if self.cfg.kl.penalty == "full":
            return turn.full_kl
        return kl_per_token(turn.raw_logprobs, turn.ref_logprobs, self.cfg.kl.penalty) \
            * turn.response_mask

    def batch(self, turn: Turn, scores: torch.Tensor | None = None) -> PPOBatch:
        """Shape a turn into a PPO batch: -kl_coef*KL per token plus the score on the last one."""
        if self.recomputes:
            turn = self.recompute(turn)
        scores = scale_scores(turn.reward if scores is None else scores, self.score_stats,
                              self.cfg, gather=self.comm.gather)
        coef = 0.0 if self.cfg.kl.where == "loss" else self.kl_coef
        rewards = token_rewards(scores, self.penalty(turn), turn.response_mask, coef)
        return PPOBatch(input_ids=turn.input_ids, attention_mask=turn.attention_mask,
                        response_mask=turn.response_mask, old_logprobs=turn.logprobs,
                        old_values=turn.values, ref_logprobs=turn.ref_logprobs, rewards=rewards,
                        scores=scores, rounds=turn.rounds,
                        is_weights=truncated_is_weights(turn, self.cfg.tis_cap))

    @property
    def recomputes(self) -> bool:
        """Whether old log-probs and values are recomputed here (cfg.old_logprobs="recompute";
        "auto" needs no pass here: the rollout already made one where decoding differs)."""
        return self.cfg.old_logprobs == "recompute"

    def recompute(self, turn: Turn) -> Turn:
        """Old log-probs and values from a full pass (4-bit / bf16 decoding differs from it)."""
        with torch.no_grad():
            ev = self.policy.evaluate(turn.input_ids, turn.attention_mask,
                                      turn.response_mask.shape[1], sampling=self.sampling)
        turn.logprobs = ev.logprobs.float() * turn.response_mask
        turn.values = ev.values.float() * turn.response_mask
        return turn

    def learn(self, batch: PPOBatch, turn: Turn, generator, accumulate: int = 1
              ) -> dict[str, float]:
        """Run PPO on the batch (each optimizer step over `accumulate` times the configured
        rows), then update the KL coefficient from this batch's KL."""
        cfg = self.cfg if accumulate == 1 else \
            replace(self.cfg, grad_accum_steps=self.cfg.grad_accum_steps * accumulate)
        stats = ppo_update(self.policy, self.optimizer, batch, cfg, generator=generator,
                           kl_coef=self.kl_coef, evaluate_kwargs={"sampling": self.sampling},
                           backward=self.comm.backward, all_ok=self.comm.all_ok)
        stats["kl_coef"] = self.kl_coef
        kl = self.comm.mean(float(self.penalty(turn).sum(1).mean()))
        self.kl_controller.update(kl, len(batch) * self.comm.world_size)
        return stats

    def state_dict(self) -> dict:
        """Optimizer, KL controller and score statistics (weights are saved by the policy)."""
        return {"optimizer": self.optimizer.state_dict(), "kl": self.kl_controller.state_dict(),
                "score_stats": self.score_stats.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict saved."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.kl_controller.load_state_dict(state["kl"])
        self.score_stats.load_state_dict(state["score_stats"])
