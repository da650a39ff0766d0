"""A run is a learner on a structure; the KL coefficient is one setting, kl_coef."""

import argparse
import dataclasses

import pytest
from helpers import ToyTask

import cory_env
from agents.learners.cory import CORY, CORY_NO_KT, CORY_NO_RE
from agents.learners.learner import Learner
from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.learners.ppo_learner import PPO
from agents.learners.registry import (
    register_learner,
    registered_learners,
    registered_methods,
    registered_structures,
    resolve_method,
)
from agents.learners.structure import INDEPENDENT, SINGLE, Structure
from agents.training.config import (
    TrainConfig,
    add_train_options,
    train_config_from,
)
from agents.training.train import Trainer

cory_env.register_task("toy", ToyTask)


def config(toy_lm, method, **kw):
    ppo = PPOConfig(mini_batch_size=8, lr=3e-3, kl=kw.pop("kl", KLConfig(coef=0.05)))
    return TrainConfig(task="toy", method=method, model=toy_lm, batch_size=8, ppo=ppo,
                       iterations=kw.pop("iterations", 2), **kw)


def numbers(rows):
    return [{k: v for k, v in m.items() if not k.startswith("time_")} for m in rows]


def test_every_method_name_resolves_to_a_learner_on_a_structure():
    pairs = {name: (m.learner.name, m.structure.name)
             for name, m in ((n, resolve_method(n)) for n in registered_methods())}
    assert pairs["ppo"] == ("ppo", "single") and pairs["ippo"] == ("ppo", "independent")
    assert pairs["cory"] == ("ppo", "cory") and pairs["cory-no-kt"] == ("ppo", "cory-no-kt")
    assert pairs["cory-grpo"] == ("grpo", "cory") and pairs["grpo"] == ("grpo", "single")
    assert pairs["cory-official"] == ("ppo-official", "cory")
    assert pairs["ppo-2x"] == ("ppo-2x", "single") and pairs["cory-mappo"] == ("mappo", "cory")
    # a bare learner name is that learner on one agent, for every learner that can train one agent
    for learner in registered_learners():
        if learner in pairs:
            assert pairs[learner] == (learner, "single"), learner
    assert pairs["reinforce"] == ("reinforce", "single")
    assert pairs["cory-reinforce"] == ("reinforce", "cory")
    with pytest.raises(ValueError, match=r"'mappo' is a learner that needs 2\+ agents.*"
                                         r"cory-mappo"):
        resolve_method("mappo")
    assert {"single", "independent", "cory", "cory-no-kt", "cory-no-re"} <= \
        set(registered_structures())
    assert {"ppo", "grpo", "dr-grpo", "rloo", "reinforce-pp", "reinforce", "mappo"} <= \
        set(registered_learners())
    m = resolve_method("rloo/cory-no-re")
    assert m.learner.name == "rloo" and m.structure == CORY_NO_RE and m.n_agents == 2
    # a structure is a value: CORY's ablations differ from it in one field each
    assert {f.name for f in dataclasses.fields(Structure)
            if getattr(CORY, f.name) != getattr(CORY_NO_KT, f.name)} == \
        {"name", "knowledge_transfer"}


@pytest.mark.parametrize("name,message", [
    ("nope", "unknown method 'nope'"), ("grpo/nowhere", "unknown structure 'nowhere'"),
    ("nothing/cory", "unknown learner 'nothing'"),
])
def test_unknown_names_are_refused_by_name(toy_lm, name, message):
    with pytest.raises(ValueError, match=message):
        resolve_method(name)
    with pytest.raises(ValueError, match=message):
        config(toy_lm, name).validate()


def test_a_composed_name_trains_like_the_registered_one(toy_lm):
    """`ppo/cory` is `cory` and `grpo/cory` is `cory-grpo`, metric for metric."""
    for composed, named in (("ppo/cory", "cory"), ("grpo/cory", "cory-grpo")):
        a = numbers(Trainer(config(toy_lm, composed)).run())
        b = numbers(Trainer(config(toy_lm, named)).run())
        assert a == b


def test_the_structure_sets_the_env_and_the_schedule(toy_lm):
    trainer = Trainer(config(toy_lm, "grpo/cory-no-kt"))
    env = trainer.env.config
    assert (env.knowledge_transfer, env.reward_mode) == (False, "collective")
    assert [trainer.learner.reset_options(i)["rotation"] for i in range(0, 20, 5)] == [0, 1, 0, 1]
    single = Trainer(config(toy_lm, "reinforce/single"))
    assert single.env.config.n_agents == 1 and list(single.learner.agents) == ["llm_0"]
    fixed = Trainer(config(toy_lm, "ppo/cory-no-re"))
    assert all(fixed.learner.reset_options(i)["rotation"] == 0 for i in range(20))


def test_a_plugin_learner_runs_on_any_structure(toy_lm):
    @register_learner("test-structure-ppo")
    class Mine(PPO):
        """A user's learner (its own name: the learner on one agent, as every bare name)."""

    assert resolve_method("test-structure-ppo").structure.name == "single"
    trainer = Trainer(config(toy_lm, "test-structure-ppo/cory", iterations=1))
    assert isinstance(trainer.learner, Mine) and trainer.learner.structure == CORY
    assert trainer.env.config.reward_mode == "collective"


def test_beta_is_one_setting_from_the_command_line_to_the_loss(toy_lm):
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    paths = add_train_options(parser)
    args = parser.parse_args(["--task", "toy", "--model", str(toy_lm), "--method", "cory",
                              "--kl-coef", "0.07", "--no-adaptive-kl", "--kl-where", "loss",
                              "--batch-size", "8"])
    cfg = train_config_from(args, paths)
    assert cfg.ppo.kl == KLConfig(coef=0.07, adaptive=False, penalty="full", where="loss",
                                  scale_horizon=True)
    trainer = Trainer(dataclasses.replace(cfg, iterations=1))
    seen = []
    for agent in trainer.learner.agents.values():
        assert agent.kl_coef == 0.07 and agent.cfg.kl.where == "loss"
    import agents.learners.ppo as ppo

    loss = ppo._minibatch_loss
    ppo._minibatch_loss = lambda policy, mb, cfg, kl_coef, kw: seen.append(kl_coef) or \
        loss(policy, mb, cfg, kl_coef, kw)
    try:
        trainer.step()
    finally:
        ppo._minibatch_loss = loss
    assert seen and set(seen) == {0.07}


def test_where_the_kl_acts_defaults_to_the_learner_and_is_refused_where_it_cannot(toy_lm):
    assert {a.cfg.kl.where for a in Trainer(config(toy_lm, "grpo")).learner.agents.values()} \
        == {"loss"}
    assert {a.cfg.kl.where for a in Trainer(config(toy_lm, "cory")).learner.agents.values()} \
        == {"reward"}
    reward = Trainer(config(toy_lm, "grpo", kl=KLConfig(where="reward")))
    assert {a.cfg.kl.where for a in reward.learner.agents.values()} == {"reward"}
    with pytest.raises(ValueError, match="rloo puts the KL in the reward"):
        Trainer(config(toy_lm, "rloo", kl=KLConfig(where="loss")))


def test_run_folders_and_checkpoints_of_an_earlier_format_are_refused_by_name(tmp_path):
    """Earlier setting names (ppo.init_kl_coef, kl_in, swap_roles, a controller's "value") are
    not read any more: a folder or checkpoint written with them is refused, naming its format."""
    import json

    from agents.training.checkpoint import FORMAT, load_trainer_state
    from benchmarks.evidence.records import RunData

    (tmp_path / "run_config.json").write_text(json.dumps(
        {"format": 2, "train": {"ppo": {"init_kl_coef": 0.2, "kl_in": "reward"}}}))
    with pytest.raises(ValueError, match="study-folder format 2, this version reads format 6"):
        RunData.load(tmp_path)
    # format 3 recorded the training combined reward at the current KL coefficient: refused
    (tmp_path / "run_config.json").write_text(json.dumps({"format": 3, "train": {}}))
    with pytest.raises(ValueError, match="study-folder format 3, this version reads format 6"):
        RunData.load(tmp_path)
    with pytest.raises(ValueError, match=f"checkpoint format 1, this version reads format "
                                         f"{FORMAT} only"):
        load_trainer_state(None, {"format": 1, "policies": {}})


def test_the_learner_settings_are_declared_once():
    """TrainConfig extends LearnerConfig: no field is declared twice or copied."""
    from agents.learners.learner import LearnerConfig

    assert issubclass(TrainConfig, LearnerConfig)
    cfg = TrainConfig(t_rex=3, report_kl_coef=0.1, group_size=2)
    part = cfg.learner_part()
    assert type(part) is LearnerConfig
    assert (part.t_rex, part.report_kl_coef, part.group_size) == (3, 0.1, 2)
    assert part.ppo is cfg.ppo and part.sampling is cfg.sampling


def test_learner_default_structure_is_two_independent_agents():
    assert Learner.structure == INDEPENDENT and SINGLE.n_agents == 1
    with pytest.raises(ValueError, match="reward_mode"):
        Structure("bad", reward_mode="team")


def test_the_old_registration_call_names_the_new_one():
    """A plug-in written for cory 0.1, `@register_learner("mine", CORY)`, is told what replaced
    it instead of "takes 1 positional argument but 2 were given"."""
    from agents.learners.cory import CORY
    from agents.learners.registry import register_learner

    for args, kwargs in ((("mine", CORY), {}), (("mine",), {"structure": CORY})):
        with pytest.raises(TypeError, match=r"cory 0\.1's call: .*@register_learner\('mine'\).*"
                                            r"register_method\('cory-mine', 'mine', CORY\)"):
            register_learner(*args, **kwargs)
