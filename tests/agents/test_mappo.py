"""MAPPO's centralized critic: its advantages, shaped rewards, passes, values and skips."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from helpers import ToyTask

import cory_env
from agents.learners.mappo import joint_sequence, mappo_advantages
from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.training.config import TrainConfig
from agents.training.train import Trainer

cory_env.register_task("toy", ToyTask)
PAD, EOS = 0, 9


def config(toy_lm, method="cory-mappo", **ppo):
    kw = dict(batch_size=8, mini_batch_size=4, lr=3e-3, kl=KLConfig(coef=0.05), ppo_epochs=2)
    kw.update(ppo)
    batch = kw.pop("batch_size")
    return TrainConfig(task="toy", method=method, model=toy_lm, batch_size=batch,
                       ppo=PPOConfig(**kw), iterations=4)


def test_individual_rewards_stop_the_pioneers_returns_at_its_turn():
    """gamma = lambda = 1, values 0: pioneer reward 0, observer reward 10 (one token each)."""
    T = 3
    rmask = torch.tensor([[1, 1, 0, 1, 1, 1]], dtype=torch.float)
    rewards = torch.tensor([[0, 0, 0, 0, 0, 10]], dtype=torch.float)
    values = torch.zeros_like(rewards)
    _, ret = mappo_advantages(rewards, values, rmask, collective=False, gamma=1.0, lam=1.0)
    assert ret[0, :T].tolist() == [0, 0, 0]  # its own reward: nothing of the observer's
    assert ret[0, T:].tolist() == [10, 10, 10]
    _, ret = mappo_advantages(rewards, values, rmask, collective=True, gamma=1.0, lam=1.0)
    assert ret[0].tolist() == [10, 10, 0, 10, 10, 10]  # the team reward reaches the pioneer


def test_individual_mode_bootstraps_the_pioneers_last_token_from_zero():
    rmask = torch.ones(1, 4)
    rewards = torch.tensor([[1.0, 2.0, 0.0, 5.0]])
    values = torch.tensor([[0.5, 0.25, 3.0, 1.0]])
    adv, ret = mappo_advantages(rewards, values, rmask, collective=False, gamma=1.0, lam=1.0)
    # pioneer: returns = reward-to-go of its own two tokens; observer likewise
    torch.testing.assert_close(ret, torch.tensor([[3.0, 2.0, 5.0, 5.0]]))
    torch.testing.assert_close(adv, ret - values)


def turn(prompt, answer, pad=PAD):
    """A hand-built turn: prompt ids (left-padded with -1 -> pad) and answer ids (None = pad)."""
    ids = [pad if t is None else t for t in prompt + answer]
    mask = [0 if t is None else 1 for t in prompt + answer]
    rmask = [0 if t is None else 1 for t in answer]
    as_t = lambda x, dt=torch.long: torch.tensor([x], dtype=dt)  # noqa: E731
    return SimpleNamespace(input_ids=as_t(ids), attention_mask=as_t(mask),
                           response_mask=as_t(rmask, torch.float))


def test_the_observers_first_value_is_read_at_the_pioneers_last_real_token():
    """The pioneer stopped after one token + EOS; its answer's pad columns hold PAD != EOS."""
    pio = turn([None, 21, 22], [31, EOS, None, None])
    obs = turn([None, 40, 41, 42, 43], [51, 52, EOS, None])
    ids, mask, rmask, cols = joint_sequence(pio, obs)
    real = ids[mask.bool()].tolist()
    assert real == [21, 22, 31, EOS, 51, 52, EOS]  # the gap moved out: one contiguous episode
    # a critic whose "value" at a position is the token id there
    value_at = ids.float().gather(1, cols)
    # each response token's value is read at the real token before it
    assert value_at[0, :2].tolist() == [22, 31]  # pioneer: after the prompt, after token 31
    assert value_at[0, 4] == EOS  # the observer's first token: after the pioneer's EOS, no pad
    assert value_at[0, 5:7].tolist() == [51, 52]
    assert rmask.tolist() == [[1, 1, 0, 0, 1, 1, 1, 0]]


def test_mappo_sees_the_same_shaped_rewards_as_every_learner(toy_lm, monkeypatch):
    """score_clip=1 with env rewards of 50: the critic's returns are clipped scores, not 50."""
    cfg = config(toy_lm, score_clip=1.0, gamma=1.0, lam=1.0,
                 kl=KLConfig(coef=0.05, penalty="full"))
    trainer = Trainer(cfg)
    learner, seen = trainer.learner, {}
    update, update_critic = learner.update, learner.update_critic

    def fifty(turns, iteration):
        for t in turns.values():
            t.reward = torch.full_like(t.reward, 50.0)
        return update(turns, iteration)

    def spy(ids, mask, rmask, cols, old_values, returns):
        seen["returns"], seen["rmask"] = returns, rmask
        return update_critic(ids, mask, rmask, cols, old_values, returns)

    monkeypatch.setattr(learner, "update", fifty)
    monkeypatch.setattr(learner, "update_critic", spy)
    trainer.step()
    ret = seen["returns"][seen["rmask"] > 0]
    assert ret.max() <= 1.0 + 1e-6  # -beta*KL only lowers it
    assert ret.max() > 0.9  # the clipped team score, once


def test_critic_passes_respect_mini_batch_and_token_cap_and_skip_the_lm_head(toy_lm):
    cfg = config(toy_lm, max_tokens_per_pass=60)
    trainer = Trainer(cfg)
    critic = trainer.learner.critic
    shapes, head_calls = [], []
    values = critic.values

    def spy(ids, mask):
        shapes.append(tuple(ids.shape))
        return values(ids, mask)

    critic.values = spy
    critic.hf_model.get_output_embeddings().register_forward_hook(
        lambda *a: head_calls.append(1))
    trainer.step()
    assert shapes and all(b <= cfg.ppo.mini_batch_size for b, _ in shapes)
    assert len(shapes) > 2 * cfg.batch_size / cfg.ppo.mini_batch_size  # old values + epochs
    assert head_calls == []  # values only: the (B, L, V) logits are never computed


def test_critic_values_follow_its_value_head_and_its_loss_falls(toy_lm):
    trainer = Trainer(config(toy_lm))
    learner = trainer.learner
    captured = {}
    update_critic = learner.update_critic

    def keep(*args):
        captured["args"] = args
        return update_critic(*args)

    learner.update_critic = keep
    trainer.step()
    ids, mask, rmask, cols, old_values, returns = captured["args"]
    # the values the critic is trained on come from its own value head at those columns
    with torch.no_grad():
        _, full, _ = learner.critic(ids, mask)
        torch.testing.assert_close(learner.critic_values(ids, mask, cols), full.gather(1, cols),
                                   atol=1e-5, rtol=1e-5)
    losses = [update_critic(ids, mask, rmask, cols, old_values, returns)["critic_value_loss"]
              for _ in range(6)]
    assert losses[-1] < 0.95 * losses[0], losses  # (value clipping bounds how far it can go)


def test_a_non_finite_critic_gradient_is_skipped_not_applied(toy_lm):
    trainer = Trainer(config(toy_lm))
    critic = trainer.learner.critic
    param = critic.trainable_parameters()[0]
    before = [p.detach().clone() for p in critic.trainable_parameters()]
    hook = param.register_hook(lambda g: torch.full_like(g, float("inf")))
    with pytest.warns(RuntimeWarning, match="critic step: non-finite grad norm"):
        m = trainer.step()
    hook.remove()
    assert m["llm_0"]["critic_skipped_batches"] == 2 * 2  # 2 epochs x 2 optimizer steps
    assert math.isnan(m["llm_0"]["critic_value_loss"])
    for p, q in zip(before, critic.trainable_parameters()):
        assert torch.equal(p, q) and torch.isfinite(q).all()
    assert trainer.step()["llm_0"]["critic_skipped_batches"] == 0  # and it trains on after


def test_individual_mode_is_accepted_and_trains(toy_lm):
    from agents.learners.mappo import MAPPO
    from agents.learners.registry import register_learner

    @register_learner("mappo-individual-test")
    class MAPPOIndividual(MAPPO):
        reward_mode = "individual"

    trainer = Trainer(config(toy_lm, "mappo-individual-test/cory-individual"))
    m = trainer.step()
    assert trainer.env.config.reward_mode == "individual"
    assert m["llm_0"]["optimizer_steps"] > 0 and math.isfinite(m["llm_0"]["critic_value_loss"])
