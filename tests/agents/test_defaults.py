"""One source for every default: a field set changes that field alone, presets state only what
differs, and each value is checked once where it enters."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import ToyTask

import cory_env
from agents.learners.learner import Learner
from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.learners.registry import register_learner, resolve_method
from agents.training.config import TrainConfig
from cory_common.cli import flatten

cory_env.register_task("toy", ToyTask)


def differences(a, b) -> dict:
    """The settings (dotted paths) whose values differ between two configs."""
    fa, fb = flatten(a), flatten(b)
    return {".".join(k): (fa[k], fb.get(k)) for k in fa if fa[k] != fb.get(k)}


def test_setting_one_ppo_field_changes_that_field_alone():
    default = TrainConfig().validate()
    for ppo, field in ((PPOConfig(lr=2e-4), "ppo.lr"), (PPOConfig(ppo_epochs=2), "ppo.ppo_epochs"),
                       (PPOConfig(kl=KLConfig(coef=0.1)), "ppo.kl.coef")):
        got = TrainConfig(ppo=ppo).validate()
        assert list(differences(got, default)) == [field], field
    # the PPO defaults are the default run's: the same config whichever door it comes through
    assert TrainConfig().ppo == PPOConfig() and TrainConfig().ppo.kl.penalty == "full"


def test_a_default_mini_batch_fits_a_smaller_batch_whatever_else_is_set():
    cfg = TrainConfig(batch_size=8, ppo=PPOConfig(lr=2e-4)).validate()
    assert (cfg.ppo.mini_batch_size, cfg.ppo.lr) == (8, 2e-4)
    with pytest.raises(ValueError, match="batch_size=8 must be divisible by mini_batch_size"):
        TrainConfig(batch_size=8, ppo=PPOConfig(mini_batch_size=16)).validate()  # set: kept


def test_presets_state_only_what_differs_from_the_defaults():
    from benchmarks.settings.presets import IMDB_PPO, PRESETS, gsm8k_ppo

    assert list(differences(IMDB_PPO, PPOConfig())) == ["lr", "mini_batch_size"]
    assert set(differences(gsm8k_ppo("cory"), PPOConfig())) == {
        "mini_batch_size", "grad_accum_steps", "kl.coef", "kl.adaptive"}  # lr 1e-4 = default
    from benchmarks.settings.config import SETTINGS, BenchConfig, setting

    base = BenchConfig()
    for name, preset in PRESETS.items():
        same = [k for k, v in preset.items() if k in SETTINGS and setting(base, k) == v
                and k not in ("quick",)]
        assert not same, f"preset {name} restates defaults: {same}"


def test_a_learner_declares_rounds_support_and_a_bare_name_is_the_learner_alone(toy_lm):
    @register_learner("test-defaults-no-rounds")
    class NoRounds(Learner):
        def update(self, turns, iteration):
            return {}

    m = resolve_method("test-defaults-no-rounds")
    assert m.structure.name == "single" and not m.learner.takes_rounds
    with pytest.raises(ValueError, match="cannot train on rounds=2"):
        TrainConfig(task="toy", model=str(toy_lm), method="test-defaults-no-rounds/cory",
                    rounds=2).validate()
    assert all(resolve_method(n).learner.takes_rounds for n in ("ppo", "grpo", "cory-mappo",
                                                              "cory-reinforce", "reinforce-pp"))


def test_the_rotation_is_checked_once_with_one_error_and_read_from_the_env(toy_lm):
    from agents.training.train import Trainer
    from cory_env import EnvConfig

    for bad in ("1", 1.5, True):
        with pytest.raises(ValueError, match=f"rotation must be an integer, got {bad!r}"):
            EnvConfig(rotation=bad).validate()
    trainer = Trainer(TrainConfig(task="toy", model=str(toy_lm), method="cory", iterations=1,
                                  batch_size=4, max_new_tokens=2, t_rex=1,
                                  ppo=PPOConfig(mini_batch_size=4, ppo_epochs=1)))
    trainer.iteration = 3  # rotation 3 // 1 = 3, which the env reduces mod 2 once
    metrics = trainer.step()
    assert metrics["rotation"] == trainer.env.rotation == 1


def test_credit_span_is_one_function():
    from agents.learners.credit import credit_span
    from agents.learners.ppo import PPOBatch

    assert (credit_span(3, "episode"), credit_span(3, "turn")) == (3, 1)
    assert "credit_span" in dir(Learner) and "rounds" not in dir(Learner)
    assert dataclasses.is_dataclass(PPOBatch)


@pytest.mark.parametrize("chain, need", [({"n_agents": 30, "max_new_tokens": 2},
                                          "n_agents=30 x rounds=1"),
                                         ({"n_agents": 3, "rounds": 12}, "n_agents=3 x rounds=12"),
                                         ({"method": "cory-mappo", "n_agents": 8},
                                          "a critic reading all 8 turns")])
def test_a_chain_longer_than_the_models_positions_is_refused_before_loading(toy_lm, chain,
                                                                             need, monkeypatch):
    import agents.training.train as train

    monkeypatch.setattr(train, "build_policies", lambda *a, **k: pytest.fail("a model loaded"))
    cfg = TrainConfig(task="toy", model=str(toy_lm), **{"method": "cory", **chain})
    with pytest.raises(ValueError, match=rf"{need}.*has 64; use fewer agents or rounds"):
        train.Trainer(cfg)
    fits = TrainConfig(task="toy", model=str(toy_lm), method="cory", n_agents=3)
    assert fits.validate().agents_count() == 3  # a chain that fits is not refused
