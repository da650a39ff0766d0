"""Learners on the batched env: role exchange, determinism, learning curves that move."""

from __future__ import annotations

import pytest
import torch
from helpers import ToyTask, needs_cxx

import cory_env
from agents.learners.cory import rotation
from agents.learners.mappo import compact, joint_gae, uncompact
from agents.learners.ppo import gae
from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.learners.registry import registered_methods
from agents.llm.rollout import rollout
from agents.training.config import TrainConfig
from agents.training.train import Trainer

cory_env.register_task("toy", ToyTask)


def config(toy_lm, method, **kw):
    ppo = PPOConfig(mini_batch_size=8, lr=3e-3, kl=KLConfig(coef=0.05),
                    max_tokens_per_pass=kw.pop("max_tokens_per_pass", None),
                    old_logprobs=kw.pop("old_logprobs", "auto"))
    return TrainConfig(task="toy", method=method, model=toy_lm, batch_size=16, ppo=ppo,
                       iterations=kw.pop("iterations", 4), **kw)


def numbers(metrics):
    """Metrics without wall-clock timings, for exact comparison."""
    return {k: v for k, v in metrics.items() if not k.startswith("time_")}


def test_role_schedule():
    assert [rotation(i, 5) for i in range(12)] == [0] * 5 + [1] * 5 + [0] * 2


def test_role_exchange_keeps_optimizer_state_and_flips_first_agent(toy_lm):
    trainer = Trainer(config(toy_lm, "cory", t_rex=2, iterations=3))
    agents = trainer.learner.agents
    optimizers = {a: s.optimizer for a, s in agents.items()}
    kl_ctls = {a: s.kl_controller for a, s in agents.items()}
    m0, m1 = trainer.step(), trainer.step()
    assert m0["llm_0"]["role"] == "pioneer" and m0["rotation"] == 0
    moments = {a: [st["exp_avg"].clone() for st in s.optimizer.state.values()]
               for a, s in agents.items()}
    steps = {a: [int(st["step"]) for st in s.optimizer.state.values()] for a, s in agents.items()}
    m2 = trainer.step()  # iteration 2: the roles are exchanged
    assert m2["rotation"] == 1 and m2["llm_1"]["role"] == "pioneer"
    assert m2["llm_0"]["role"] == "observer"
    for a, s in agents.items():
        assert s.optimizer is optimizers[a] and s.kl_controller is kl_ctls[a]
        # Adam kept its moments: the step count went on from where it was
        assert [int(st["step"]) for st in s.optimizer.state.values()] == \
            [n + m1[a]["optimizer_steps"] for n in steps[a]]
        assert all(st["exp_avg"].abs().sum() > 0 for st in s.optimizer.state.values())
        assert any(not torch.equal(a_, b_) for a_, b_ in
                   zip(moments[a], [st["exp_avg"] for st in s.optimizer.state.values()]))


@pytest.mark.parametrize("method", ["ppo", "cory", "cory-mappo", "cory-reinforce"])
def test_learners_raise_the_task_reward(toy_lm, method):
    trainer = Trainer(config(toy_lm, method, iterations=10, seed=1))
    curve = [m["llm_0"]["task_reward"] for m in trainer.run()]
    assert sum(curve[-3:]) / 3 > sum(curve[:3]) / 3 + 0.5, curve


@pytest.mark.parametrize("method", ["cory", "cory-mappo"])  # mappo: its critic's passes too
def test_a_token_cap_splits_passes_and_still_learns(toy_lm, method):
    """ppo.max_tokens_per_pass: the same first rollout (prompt pass in chunks), then learning."""
    trainer = Trainer(config(toy_lm, method, iterations=10, seed=1, max_tokens_per_pass=40))
    assert all(p.prefill_chunk_tokens == 40 for p in trainer.learner.policies.values())
    plain = Trainer(config(toy_lm, method, iterations=1, seed=1)).step()
    curve = [m["llm_0"]["task_reward"] for m in trainer.run()]
    assert curve[0] == plain["llm_0"]["task_reward"]  # identical sampled answers
    assert sum(curve[-3:]) / 3 > sum(curve[:3]) / 3 + 0.5, curve


@pytest.mark.parametrize("precision,mode,recomputes", [
    (None, "auto", False), (None, "recompute", True), ("bf16", "auto", False),
    ("bf16", "sampler", False)])
def test_old_logprobs_come_from_where_the_config_says(toy_lm, precision, mode, recomputes):
    """ppo.old_logprobs: the rollout's own (under bf16 from its full pass), or one more
    recomputing pass in the learner."""
    trainer = Trainer(config(toy_lm, "ppo", mixed_precision=precision, old_logprobs=mode))
    turn = rollout(trainer.env, trainer.learner.policies, trainer.cfg.sampling)["llm_0"]
    sampled = turn.logprobs.clone()
    if precision:  # the rollout's numbers are a full pass's: exactly what evaluate gives
        policy = trainer.learner.policies["llm_0"]
        with torch.no_grad():
            ev = policy.evaluate(turn.input_ids, turn.attention_mask, turn.response_mask.shape[1],
                                 trainer.cfg.sampling)
        assert torch.equal(sampled, ev.logprobs.float() * turn.response_mask)
    agent = trainer.learner.agents["llm_0"]
    assert agent.recomputes == recomputes
    passes = []
    recompute = agent.recompute
    agent.recompute = lambda t: passes.append(1) or recompute(t)
    batch = agent.batch(turn)
    assert len(passes) == recomputes
    if not recomputes:
        assert torch.equal(batch.old_logprobs, sampled)
    else:  # the pass agrees with the sampler: to 1e-5 in fp32, to bf16 rounding otherwise
        tol = 1e-5 if precision is None else 0.1
        torch.testing.assert_close(batch.old_logprobs, sampled, atol=tol, rtol=0)


def test_same_seed_same_metrics(toy_lm):
    a = [numbers(m) for m in Trainer(config(toy_lm, "cory", iterations=2)).run()]
    b = [numbers(m) for m in Trainer(config(toy_lm, "cory", iterations=2)).run()]
    assert a == b


def test_method_presets_set_the_env_structure(toy_lm):
    for method, kt, mode in [("cory", True, "collective"), ("cory-no-kt", False, "collective"),
                             ("cory-individual", True, "individual")]:
        trainer = Trainer(config(toy_lm, method, iterations=1))
        assert trainer.env.config.knowledge_transfer is kt
        assert trainer.env.config.reward_mode == mode
    trainer = Trainer(config(toy_lm, "cory-no-re"))
    assert all(trainer.learner.reset_options(i)["rotation"] == 0 for i in range(20))
    assert Trainer(config(toy_lm, "ppo")).env.config.n_agents == 1
    methods = {"ppo", "ippo", "cory", "cory-mappo", "cory-no-kt", "cory-no-re", "cory-individual"}
    assert methods | {"reinforce"} <= set(registered_methods())


def test_bad_train_config_names_the_field(toy_lm):
    with pytest.raises(ValueError, match="unknown method 'sac'"):
        Trainer(config(toy_lm, "sac"))
    with pytest.raises(ValueError, match="iterations must be a positive integer, got 0"):
        config(toy_lm, "ppo", iterations=0).validate()
    bad = config(toy_lm, "ppo")
    bad.batch_size = 12  # not divisible by mini_batch_size 8
    with pytest.raises(ValueError, match="batch_size=12"):
        bad.validate()


def test_joint_gae_skips_gaps_like_a_compact_sequence():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 0, 1, 1]], dtype=torch.float)
    rewards, values = torch.randn(2, 5) * mask, torch.randn(2, 5) * mask
    adv, ret = joint_gae(rewards, values, mask, 1.0, 0.95)
    for row in range(2):
        idx = mask[row].nonzero().squeeze(1)
        a, r = gae(rewards[row, idx][None], values[row, idx][None], torch.ones(1, len(idx)),
                   1.0, 0.95)
        torch.testing.assert_close(adv[row, idx], a[0])
        torch.testing.assert_close(ret[row, idx], r[0])
    x, order = compact(torch.arange(5.0).expand(2, 5), mask)
    assert torch.equal(uncompact(x, order), torch.arange(5.0).expand(2, 5))


@pytest.mark.parametrize("method", ["cory", "cory-mappo"])
def test_resume_from_checkpoint_equals_uninterrupted_run(toy_lm, tmp_path, method):
    full = [numbers(m) for m in Trainer(config(toy_lm, method, iterations=4, t_rex=1)).run()]
    first = Trainer(config(toy_lm, method, iterations=4, t_rex=1))
    head = [numbers(first.step()) for _ in range(2)]
    first.save(str(tmp_path / "ckpt.pt"))
    del first
    resumed = Trainer(config(toy_lm, method, iterations=4, t_rex=1))
    resumed.load(str(tmp_path / "ckpt.pt"))
    tail = [numbers(m) for m in resumed.run()]
    assert head + tail == full


@needs_cxx
def test_torch_compile_reaches_every_policy_and_training_still_learns(toy_lm):
    """TrainConfig.torch_compile: each policy compiles its training passes; PPO still learns."""
    trainer = Trainer(config(toy_lm, "ppo", iterations=6, seed=1, torch_compile=True))
    assert all(p.compile_training for p in trainer.learner.policies.values())
    curve = [m["llm_0"]["task_reward"] for m in trainer.run()]
    assert trainer.learner.policies["llm_0"]._compiled_bodies
    assert sum(curve[-2:]) / 2 > sum(curve[:2]) / 2 + 0.3, curve
