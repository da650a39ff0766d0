"""The group-baseline family (grpo, dr-grpo, rloo, reinforce-pp) and group rollouts."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import ToyTask

import cory_env
from agents.learners.dr_grpo import DrGRPO
from agents.learners.grpo import GRPO
from agents.learners.learner import joint_whiten
from agents.learners.ppo import aggregate, policy_loss
from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.learners.registry import resolve_method
from agents.learners.rloo import RLOO
from agents.llm.policy import LLMPolicy
from agents.llm.rollout import play_turn
from agents.training.config import TrainConfig
from agents.training.train import Trainer
from examples.exercises.common import course_lm

cory_env.register_task("toy", ToyTask)
FAMILY = ["grpo", "dr-grpo", "rloo", "reinforce-pp"]
RETURNS = torch.tensor([1.0, 2.0, 3.0, 6.0, 5.0, 5.0, 5.0, 5.0])  # two groups of 4


# ----------------------------------------------------------------------------- the maths
def test_grpo_advantages_by_hand():
    adv = GRPO.advantages(None, RETURNS, 4)
    std = math.sqrt((4 + 1 + 0 + 9) / 3)  # group 1: mean 3, Bessel-corrected std
    expected = [(1 - 3) / std, (2 - 3) / std, 0.0, (6 - 3) / std, 0, 0, 0, 0]
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-5, rtol=1e-5)
    assert torch.isfinite(adv).all()  # the all-equal group: zero advantage, not NaN


def test_dr_grpo_and_rloo_advantages_by_hand():
    assert DrGRPO.advantages(None, RETURNS, 4).tolist() == [-2, -1, 0, 3, 0, 0, 0, 0]
    # leave-one-out: r_i - (sum - r_i) / (G - 1), sum of group 1 = 12
    loo = RLOO.advantages(None, RETURNS, 4)
    torch.testing.assert_close(loo, torch.tensor([1 - 11 / 3, 2 - 10 / 3, 3 - 9 / 3, 6 - 6 / 3,
                                                  0, 0, 0, 0]))
    torch.testing.assert_close(loo, DrGRPO.advantages(None, RETURNS, 4) * 4 / 3)


def test_loss_aggregations_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(x, mask, "token-mean") == pytest.approx(10 / 4)
    assert aggregate(x, mask, "seq-mean-token-mean") == pytest.approx((6 / 3 + 4 / 1) / 2)
    assert aggregate(x, mask, "seq-mean-token-sum") == pytest.approx((6 / 3 + 4 / 3) / 2)
    # the clipped surrogate at ratio 1 is -A, aggregated the same way
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, 0.0, 0.0]])
    zero = torch.zeros(2, 3)
    loss, _ = policy_loss(zero, zero, adv, mask, 0.2, "seq-mean-token-mean")
    assert float(loss) == pytest.approx(-(1 + -2) / 2)
    loss, _ = policy_loss(zero, zero, adv, mask, 0.2, "seq-mean-token-sum")
    assert float(loss) == pytest.approx(-(3 / 3 - 2 / 3) / 2)
    with pytest.raises(ValueError, match="loss_agg must be one of"):
        PPOConfig(loss_agg="sum").validate()


def test_per_agent_norm_off_pools_both_agents_answers():
    learner = GRPO.__new__(GRPO)
    learner.cfg = type("C", (), {"per_agent_norm": False})()
    returns = {"llm_0": torch.tensor([1.0, 3.0]), "llm_1": torch.tensor([5.0, 7.0])}
    adv = learner.grouped(returns, 2)
    std = math.sqrt((9 + 1 + 1 + 9) / 3)  # one group of 4: mean 4
    torch.testing.assert_close(adv["llm_0"], torch.tensor([-3 / std, -1 / std]))
    torch.testing.assert_close(adv["llm_1"], torch.tensor([1 / std, 3 / std]))
    learner.cfg.per_agent_norm = True
    per = learner.grouped(returns, 2)
    torch.testing.assert_close(per["llm_0"], per["llm_1"])  # each agent on its own statistics


def test_joint_whitening_uses_one_mean_and_std():
    a, b = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 100.0]])
    ma, mb = torch.ones(1, 2), torch.tensor([[1.0, 0.0]])
    wa, wb = joint_whiten([a, b], [ma, mb])
    std = torch.tensor([1.0, 2.0, 3.0]).std()
    torch.testing.assert_close(wa, (a - 2) / (std + 1e-8))
    assert wb.tolist() == [[pytest.approx(float(1 / std)), 0.0]]


# ----------------------------------------------------------------------------- group rollouts
def test_group_rollout_repeats_each_query_and_says_which(toy_task):
    env = cory_env.BatchedCoryEnv(batch_size=8, task="toy", seed=3)
    env.reset(options={"group_size": 4})
    turn_queries = env.episodes.queries
    assert turn_queries[:4] == [turn_queries[0]] * 4 and turn_queries[4:] == [turn_queries[4]] * 4
    pool = env.task.queries()
    assert env.pool_size == len(pool) and env.group_size == 4
    assert [pool[i] for i in env.query_indices] == turn_queries
    env.reset(options={"group_size": 2, "queries": [3, 1, 0, 2]})
    assert env.query_indices.tolist() == [3, 3, 1, 1, 0, 0, 2, 2]
    with pytest.raises(ValueError, match="group_size=3 must divide the number of episodes"):
        env.reset(options={"group_size": 3})
    with pytest.raises(ValueError, match="group_size must be a positive integer, got 0"):
        env.reset(options={"group_size": 0})
    with pytest.raises(ValueError, match="group_size=2 must divide the number of episodes"):
        cory_env.raw_env(task="toy").reset(options={"group_size": 2})


def test_shared_prefill_equals_a_pass_per_row(toy_lm):
    """One prompt pass per group gives the tokens and log-probs of B passes; the G answers
    of a group are sampled independently."""
    policy = LLMPolicy.from_pretrained(toy_lm, reference="copy")
    out = {}
    for share in (True, False):
        env = cory_env.BatchedCoryEnv(batch_size=8, task="toy", seed=0)
        env.reset(options={"group_size": 4})
        steps = play_turn(env, policy, None, torch.Generator().manual_seed(0), share=share)
        out[share] = [torch.stack([getattr(s, k) for s in steps], 1) for k in ("token", "logprob")]
    assert torch.equal(out[True][0], out[False][0])
    torch.testing.assert_close(out[True][1], out[False][1], atol=1e-5, rtol=1e-5)
    tokens = out[True][0]
    assert any(not torch.equal(tokens[0], tokens[k]) for k in range(1, 4))


def test_learners_see_the_group_and_the_pool(toy_lm):
    ppo = PPOConfig(mini_batch_size=4, lr=1e-3)
    trainer = Trainer(TrainConfig(task="toy", method="grpo", model=toy_lm, batch_size=8,
                                  ppo=ppo, iterations=1))
    seen = {}
    update = trainer.learner.update

    def spy(turns, iteration):
        seen.update(turns)
        return update(turns, iteration)

    trainer.learner.update = spy
    trainer.step()
    turn = seen["llm_0"]
    assert turn.group_size == 4 and turn.groups == 2 and turn.pool_size == len(ToyTask.PROMPTS)
    assert turn.query_index.tolist()[:4] == [turn.query_index[0].item()] * 4


def test_a_group_learner_refuses_a_group_that_does_not_fit(toy_lm):
    ppo = PPOConfig(mini_batch_size=6)
    with pytest.raises(ValueError, match="batch_size=6 must be divisible by the group size 4"):
        TrainConfig(task="toy", method="grpo", model=toy_lm, batch_size=6, ppo=ppo).validate()
    with pytest.raises(ValueError, match="grpo needs group_size >= 2"):
        Trainer(TrainConfig(task="toy", method="grpo", model=toy_lm, batch_size=6, ppo=ppo,
                            group_size=1))


# ----------------------------------------------------------------------------- learning
@pytest.fixture(scope="module")
def course_model(tmp_path_factory):
    return course_lm(str(tmp_path_factory.mktemp("course")))


def course_run(model, method, iterations=6, seed=0):
    """llm_0's reward curve on the course prompts with the `colours` reward (colour words in
    the answer, 0-2: dense enough for a tiny LM to learn in seconds; the course's exact-colour
    reward plateaus near 0.1 for every learner, PPO included, at this size)."""
    ppo = PPOConfig(mini_batch_size=16, lr=1e-2,
                    kl=KLConfig(coef=0.02, penalty="kl"))
    cfg = TrainConfig(task="colours", method=method, model=model, batch_size=32, seed=seed,
                      iterations=iterations, t_rex=3, ppo=ppo)
    return [m["llm_0"]["task_reward"] for m in Trainer(cfg).run()]


@pytest.mark.parametrize("method", FAMILY + [f"cory-{m}" for m in FAMILY])
def test_each_group_learner_raises_the_reward_on_the_course(course_model, method):
    curve = course_run(course_model, method)  # measured: 0.53 -> 1.7-1.9 (single), 1.3-1.9
    assert sum(curve[-2:]) / 2 > curve[0] + 0.6, curve
    assert resolve_method(method).n_agents == (2 if method.startswith("cory-") else 1)


def test_group_learners_are_deterministic_under_a_seed(course_model):
    assert course_run(course_model, "cory-grpo", 3) == course_run(course_model, "cory-grpo", 3)


@pytest.mark.parametrize("method", ["cory", "cory-mappo"])
def test_per_agent_norm_chooses_whose_statistics_whiten_the_advantages(toy_lm, method):
    def advantages(per_agent_norm):
        ppo = PPOConfig(mini_batch_size=4, lr=1e-3)
        trainer = Trainer(TrainConfig(task="toy", method=method, model=toy_lm, batch_size=8,
                                      ppo=ppo, iterations=1, per_agent_norm=per_agent_norm))
        got = {}
        for name, agent in trainer.learner.agents.items():
            learn = agent.learn

            def spy(batch, turn, gen, learn=learn, name=name):
                if batch.advantages is None:  # the ppo learner whitens inside ppo_update
                    from agents.learners.ppo import prepare_advantages
                    prepare_advantages(batch, trainer.learner.agents[name].cfg)
                got[name] = batch.advantages[batch.response_mask > 0]
                return learn(batch, turn, gen)

            agent.learn = spy
        trainer.step()
        return got

    per = advantages(True)
    for a in per.values():  # each agent: mean 0, std 1 on its own
        assert float(a.mean()) == pytest.approx(0, abs=1e-5)
        assert float(a.std()) == pytest.approx(1, abs=1e-3)
    joint = torch.cat(list(advantages(False).values()))
    assert float(joint.mean()) == pytest.approx(0, abs=1e-5)
    assert float(joint.std()) == pytest.approx(1, abs=1e-3)
