"""Rounds in the learners: an agent's turns stacked, GAE across them, credit that learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import ToyTask

import cory_env
from agents.learners.credit import episode_returns, episodes_of, split_turns
from agents.learners.mappo import episode_order, joint_sequence, view
from agents.learners.ppo import gae
from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.llm.rollout import rollout
from agents.training.config import TrainConfig
from agents.training.train import Trainer


class FirstWordCounts(ToyTask):
    """Two rounds; paid only at the end, the toy score of what was said in round 1."""

    name = "first-word-counts"

    def round_scores(self, queries, answers, n_agents, last):
        scores = self.reward(queries, answers[0]) if last else np.zeros(len(queries))
        return np.tile(scores, (n_agents, 1))


cory_env.register_task("first-word-counts", FirstWordCounts)
cory_env.register_task("toy", ToyTask)


def config(toy_lm, method="ppo", **kw):
    ppo = PPOConfig(mini_batch_size=8, lr=3e-3, kl=KLConfig(coef=0.05),
                    credit=kw.pop("credit", "episode"))
    return TrainConfig(task=kw.pop("task", "first-word-counts"), method=method, model=toy_lm,
                       batch_size=16, ppo=ppo, iterations=kw.pop("iterations", 2), **kw)


def test_gae_steps_over_gaps_and_equals_the_plain_recursion_on_a_prefix():
    """One trajectory with a gap: the value after the gap bootstraps the token before it."""
    r = torch.tensor([[0.0, 1.0, 0.0, 0.0, 2.0]])
    v = torch.tensor([[0.5, 0.2, 9.0, 9.0, 0.4]])
    m = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.8)
    d4 = 2.0 - 0.4
    d1 = 1.0 + 0.9 * 0.4 - 0.2
    a1 = d1 + 0.9 * 0.8 * d4
    d0 = 0.0 + 0.9 * 0.2 - 0.5
    expect = torch.tensor([[d0 + 0.72 * a1, a1, 0.0, 0.0, d4]])
    assert torch.allclose(adv, expect) and torch.allclose(ret, (expect + v) * m)
    dense = gae(r[:, [0, 1, 4]], v[:, [0, 1, 4]], torch.ones(1, 3), 0.9, 0.8)[0]
    assert torch.allclose(dense, adv[:, [0, 1, 4]])


def test_turns_of_an_episode_are_laid_end_to_end_and_back():
    x = torch.arange(24.0).view(6, 4)  # 3 rounds x 2 episodes, round-major
    joined = episodes_of(x, 3)
    assert joined.shape == (2, 12) and torch.equal(joined[1, :4], x[1])
    assert torch.equal(joined[1, 4:8], x[3]) and torch.equal(split_turns(joined, 3), x)
    assert torch.equal(episode_returns(torch.tensor([1.0, 2, 3, 4, 5, 6]), 3),
                       torch.tensor([9.0, 12, 9, 12, 9, 12]))


def test_a_rollout_stacks_each_agents_turns_round_major(toy_lm):
    trainer = Trainer(config(toy_lm, "cory", task="toy", rounds=3))
    env = trainer.env
    turns = rollout(env, trainer.learner.policies, trainer.cfg.sampling,
                    torch.Generator().manual_seed(0))
    ep = env.episodes
    for position, agent in enumerate(env.agents):
        turn = turns[agent]
        assert turn.rounds == 3 and turn.input_ids.shape[0] == 3 * 16
        for r in range(3):
            j = r * 2 + position
            assert torch.equal(turn.input_ids[r * 16:(r + 1) * 16], torch.as_tensor(ep.ids[j]))
            assert turn.texts[r * 16:(r + 1) * 16] == ep.texts[j]
        # toy rewards are paid on the last round only, collectively
        assert torch.equal(turn.reward[:32], torch.zeros(32))
        assert torch.allclose(turn.reward[32:], torch.as_tensor(ep.task_rewards.sum(0)).float())
    metrics = trainer.learner.metrics(turns, {})
    for agent, turn in turns.items():
        m = metrics[agent]
        assert m["task_reward"] == pytest.approx(float(turn.task_reward[32:].mean()))
        assert m["kl"] == pytest.approx(float(turn.full_kl.sum(1).view(3, -1).sum(0).mean()))
        assert {f"round_{r}_{k}" for r in (1, 2, 3) for k in ("task_reward", "kl")} <= set(m)


@pytest.mark.parametrize("method", ["cory-grpo", "cory-reinforce-pp", "cory-reinforce"])
def test_the_group_and_critic_free_learners_train_on_rounds(toy_lm, method):
    trainer = Trainer(config(toy_lm, method, task="toy", rounds=2, group_size=4
                             if "grpo" in method else None))
    metrics = list(trainer.run())
    assert all(np.isfinite(m["llm_0"]["round_2_task_reward"]) for m in metrics)


def test_credit_across_turns_learns_what_per_turn_credit_cannot(toy_lm):
    """Paid at the end for what round 1 said: GAE across the agent's two turns carries the
    reward back to round 1's tokens and the score rises; with each turn by itself round 1 is
    never paid and it does not."""
    curves = {}
    for credit in ("episode", "turn"):
        trainer = Trainer(config(toy_lm, credit=credit, iterations=12, seed=1, rounds=2))
        curves[credit] = [m["llm_0"]["task_reward"] for m in trainer.run()]
    across, alone = curves["episode"], curves["turn"]
    assert across[0] == alone[0]  # the same first rollout
    gain = {k: sum(c[-3:]) / 3 - sum(c[:3]) / 3 for k, c in curves.items()}
    assert gain["episode"] > 1.5 and gain["turn"] < 0.5, curves


@pytest.mark.parametrize("method", ["cory-mappo", "mappo/independent"])
def test_mappo_reads_every_rounds_transcript_and_trains(toy_lm, method):
    trainer = Trainer(config(toy_lm, method, task="toy", rounds=2))
    turns = rollout(trainer.env, trainer.learner.policies, trainer.cfg.sampling,
                    torch.Generator().manual_seed(0))
    chain = sorted(turns.values(), key=lambda t: t.position)
    order = episode_order(chain)
    assert [(t.agent, r.start) for t, r in order] == [
        (chain[0].agent, 0), (chain[1].agent, 0), (chain[0].agent, 16), (chain[1].agent, 16)]
    ids, _, rmask, _ = joint_sequence(*(view(t, r) for t, r in order))
    T = chain[0].response_mask.shape[1]
    assert rmask.shape == (16, 4 * T) and ids.shape[1] == chain[0].input_ids.shape[1] + 3 * T
    stats = trainer.learner.update(turns, 0)
    assert all(np.isfinite(s["critic_value_loss"]) for s in stats.values())


def test_a_learner_that_reads_one_round_is_refused_rounds_by_name(toy_lm, monkeypatch):
    from agents.learners.ppo_learner import PPO

    monkeypatch.setattr(PPO, "takes_rounds", False)
    with pytest.raises(ValueError, match="'cory' cannot train on rounds=3 .*use rounds=1"):
        config(toy_lm, "cory", task="toy", rounds=3).validate()
    config(toy_lm, "cory", task="toy", rounds=1).validate()
    with pytest.raises(ValueError, match="PPOConfig.credit must be one of"):
        PPOConfig(credit="round")


@pytest.mark.parametrize("method, rounds", [("cory", 2), ("cory-shared", 1)])
def test_a_run_resumes_from_its_checkpoint_exactly(toy_lm, tmp_path, method, rounds):
    """With rounds, and with one policy shared by both roles."""
    def numbers(m):
        return {a: {k: v for k, v in s.items() if not k.startswith("time_")}
                for a, s in m.items() if isinstance(s, dict)}

    straight = Trainer(config(toy_lm, method, task="toy", rounds=rounds, iterations=3))
    expected = [numbers(m) for m in straight.run()]
    first = Trainer(config(toy_lm, method, task="toy", rounds=rounds, iterations=3))
    first.step()
    first.save(str(tmp_path / "ckpt.pt"))
    again = Trainer(config(toy_lm, method, task="toy", rounds=rounds, iterations=3))
    again.load(str(tmp_path / "ckpt.pt"))
    assert [numbers(m) for m in again.run()] == expected[1:]


def test_cory_shared_trains_one_policy_on_both_roles_and_says_what_each_contributes(toy_lm):
    trainer = Trainer(config(toy_lm, "cory-shared", task="toy", iterations=10, seed=1))
    learner = trainer.learner
    assert learner.policies["llm_0"] is learner.policies["llm_1"]
    assert learner.agents["llm_0"] is learner.agents["llm_1"]  # one optimizer, one KL control
    curve = list(trainer.run())
    for m in curve:
        shares = [m[a]["role_grad_share"] for a in ("llm_0", "llm_1")]
        assert sum(shares) == pytest.approx(1.0) and all(s > 0 for s in shares)
        assert m["llm_0"]["role"] == "pioneer" and m["rotation"] == 0  # one model: no exchange
    rewards = [m["llm_0"]["task_reward"] + m["llm_1"]["task_reward"] for m in curve]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 1.0, rewards
    with pytest.raises(ValueError, match="'grpo/cory-shared': the grpo learner cannot train "
                                         "one shared policy"):
        config(toy_lm, "grpo/cory-shared", task="toy").validate()
    with pytest.raises(ValueError, match="one model for every position: models="):
        config(toy_lm, "cory-shared", task="toy", models={"llm_1": toy_lm}).validate()


def test_cory_shared_takes_ppos_optimizer_steps_and_the_named_variant_k_times(toy_lm):
    """Batch 16 at mini-batch 8, 4 epochs: PPO takes 2 steps an epoch; `cory-shared`'s one
    update of both roles' 32 rows accumulates them into the same 8 steps."""
    steps = {m: Trainer(config(toy_lm, m, task="toy", iterations=1)).step()
             for m in ("ppo", "cory-shared", "cory-shared-more-steps")}
    assert steps["ppo"]["llm_0"]["optimizer_steps"] == 8
    assert steps["cory-shared"]["llm_0"]["optimizer_steps"] == 8
    assert steps["cory-shared-more-steps"]["llm_0"]["optimizer_steps"] == 16


def test_a_transcript_over_rounds_longer_than_the_models_positions_is_refused(toy_lm):
    """MAPPO's critic reads every turn of every round: 64 positions are too few here, and the
    run is refused before any model loads."""
    with pytest.raises(ValueError, match=r"n_agents=2 x rounds=4 does not fit model=.*a critic "
                                         r"reading all 8 turns .* the model has 64"):
        Trainer(config(toy_lm, "cory-mappo", task="toy", rounds=4))
