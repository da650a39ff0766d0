"""The confound arms: CORY as the official code runs it, PPO with CORY's budget, sampled KL."""

from __future__ import annotations

import pytest
import torch
from helpers import ToyTask

import cory_env
from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.learners.ppo_variants import drawn_length
from agents.training.config import TrainConfig
from agents.training.train import Trainer

cory_env.register_task("toy", ToyTask)


def config(toy_lm, method, **kw):
    ppo = kw.pop("ppo", PPOConfig(mini_batch_size=8, lr=1e-3, kl=KLConfig(coef=0.3)))
    return TrainConfig(task="toy", method=method, model=toy_lm, batch_size=8, ppo=ppo,
                       iterations=3, max_new_tokens=8, **kw)


def test_reset_option_caps_every_answer_of_a_batch_without_adding_eos():
    env = cory_env.BatchedCoryEnv(batch_size=4, task=ToyTask(), max_new_tokens=6)
    env.reset(seed=0, options={"max_new_tokens": 2})
    word = env.tokenizer.convert_tokens_to_ids("good")
    steps = 0
    while not env.finished:
        env.step(torch.full((4,), word))
        steps += 1
    assert steps == 4  # two turns of two tokens
    assert all(r == "good good" for info in env.infos().values() for r in info["response"])
    aec = cory_env.env(task=ToyTask(), max_new_tokens=6)
    aec.reset(seed=0, options={"max_new_tokens": 3})
    seen = {}
    for agent in aec.agent_iter():
        _, _, term, trunc, info = aec.last()
        seen[agent] = info.get("response")
        aec.step(None if term or trunc else word)
    assert seen == {"llm_0": "good good good", "llm_1": "good good good"}
    with pytest.raises(ValueError, match=r"max_new_tokens=7 for this reset must be in \[1, 6\]"):
        env.reset(options={"max_new_tokens": 7})
    with pytest.raises(ValueError, match="must be a positive integer, got 0"):
        env.reset(options={"max_new_tokens": 0})


def test_official_length_sampler_draws_once_per_batch_within_its_range():
    lengths = [drawn_length(0, i, 16) for i in range(200)]
    assert set(lengths) == set(range(4, 16))  # LengthSampler(4, 16)
    assert lengths == [drawn_length(0, i, 16) for i in range(200)]  # resume-safe
    assert lengths != [drawn_length(1, i, 16) for i in range(200)]
    assert drawn_length(0, 0, 3) == 3  # a cap below 4


def test_cory_official_uses_the_official_settings(toy_lm):
    trainer = Trainer(config(toy_lm, "cory-official"))
    for agent in trainer.learner.agents.values():
        assert agent.cfg.use_score_scaling and agent.cfg.use_score_norm
        assert agent.kl_coef == 0.4
    assert trainer.learner.sampling.repetition_penalty == 1.1
    for it in range(3):
        cap = drawn_length(0, it, 8)
        out = trainer.step()
        assert out["llm_0"]["response_length"] <= cap and out["llm_1"]["response_length"] <= cap
    fixed = Trainer(config(toy_lm, "cory-official", report_kl_coef=0.05,
                           ppo=PPOConfig(mini_batch_size=8,
                                         kl=KLConfig(coef=0.05, adaptive=False))))
    assert all(a.kl_coef == 0.05 for a in fixed.learner.agents.values())  # a fixed η is kept


def test_ppo_2x_sees_twice_the_episodes_in_as_many_optimizer_steps(toy_lm):
    ppo, double = Trainer(config(toy_lm, "ppo")), Trainer(config(toy_lm, "ppo-2x"))
    assert (ppo.env.batch_size, double.env.batch_size) == (8, 16)
    assert double.cfg.ppo.mini_batch_size == 8 and double.cfg.ppo.grad_accum_steps == 2
    a, b = ppo.step(), double.step()
    assert a["llm_0"]["optimizer_steps"] == b["llm_0"]["optimizer_steps"]


def test_sampled_kl_arms_use_the_sampled_log_ratio(toy_lm):
    for method in ("ppo-sampled-kl", "cory-sampled-kl"):
        trainer = Trainer(config(toy_lm, method, ppo=PPOConfig(
            mini_batch_size=8, kl=KLConfig(penalty="full"))))
        assert all(a.cfg.kl.penalty == "kl" for a in trainer.learner.agents.values())


def test_scaled_kl_horizon_moves_the_coefficient_per_iteration_as_at_batch_256():
    from agents.learners.shaping import make_kl_controller

    raw = (PPOConfig(mini_batch_size=32, kl=KLConfig(scale_horizon=False)), 32)
    scaled = (PPOConfig(mini_batch_size=32, kl=KLConfig(scale_horizon=True)), 32)
    paper = (PPOConfig(mini_batch_size=256), 256)
    steps = {}
    for name, (cfg, batch) in (("raw", raw), ("scaled", scaled), ("paper", paper)):
        ctl = make_kl_controller(cfg, batch)
        ctl.update(100.0, batch)  # KL far above target: the step is clipped at +20%
        steps[name] = ctl.coef / cfg.kl.coef - 1
    assert steps["scaled"] == pytest.approx(steps["paper"]) == pytest.approx(0.2 * 256 / 10000)
    assert steps["raw"] == pytest.approx(0.2 * 32 / 10000)
