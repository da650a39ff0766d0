"""Robustness end to end through the Trainer: non-finite batches, out of memory, bad configs."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from helpers import ToyTask

import cory_env
from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.training import train as train_module
from agents.training.config import TrainConfig
from agents.training.train import Trainer

cory_env.register_task("toy", ToyTask)


def config(model, method="cory", **kw):
    ppo = PPOConfig(mini_batch_size=4, ppo_epochs=2, lr=3e-3, kl=KLConfig(coef=0.05),
                    **kw.pop("ppo", {}))
    return TrainConfig(task=kw.pop("task", "toy"), method=method, model=model, batch_size=8,
                       ppo=ppo, iterations=kw.pop("iterations", 3), **kw)


def weights(trainer) -> list[torch.Tensor]:
    ps = [p for pol in trainer.learner.policies.values() for p in pol.trainable_parameters()]
    if getattr(trainer.learner, "critic", None) is not None:
        ps += trainer.learner.critic.trainable_parameters()
    return [p.detach().clone() for p in ps]


def poison(kind: str):
    """A function that corrupts one iteration's data the way `kind` says."""
    def apply(trainer, turns):
        for turn in turns.values():
            if kind == "nan_reward":
                turn.reward = torch.full_like(turn.reward, float("nan"))
            elif kind == "inf_reward":
                turn.reward = torch.full_like(turn.reward, float("inf"))
            elif kind == "nan_logprobs":  # a NaN inside a turn: the PPO ratio is NaN
                turn.logprobs = turn.logprobs.clone()
                turn.logprobs[0, 0] = float("nan")
    return apply


def huge_task_reward(trainer):
    """The task's reward function returns 1e30: finite, but the value loss overflows."""
    task = trainer.env.task
    task.reward = lambda queries, responses: np.full(len(responses), 1e30, dtype=np.float32)


@pytest.mark.parametrize("method,kind", [("cory", "nan_reward"), ("cory", "inf_reward"),
                                         ("cory", "nan_logprobs"), ("cory", "huge_task_reward"),
                                         ("ppo", "nan_reward"), ("cory-mappo", "nan_reward")])
def test_a_non_finite_iteration_is_skipped_logged_and_the_run_continues(toy_lm, method, kind):
    trainer = Trainer(config(toy_lm, method))
    bad_iteration = 1
    update = trainer.learner.update
    original_reward = trainer.env.task.reward

    def patched(turns, iteration):
        if iteration == bad_iteration and kind != "huge_task_reward":
            poison(kind)(trainer, turns)
        return update(turns, iteration)

    trainer.learner.update = patched
    history = [trainer.step()]  # iteration 0: clean
    before = weights(trainer)
    if kind == "huge_task_reward":
        huge_task_reward(trainer)
    with pytest.warns(RuntimeWarning, match="PPO: skipping minibatch .*non-finite"):
        history.append(trainer.step())  # iteration 1: poisoned
    trainer.env.task.reward = original_reward
    after_bad = weights(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a clean iteration skips nothing
        history.append(trainer.step())  # iteration 2: clean again
    agents = [a for a in history[1] if a.startswith("llm_")]
    for a in agents:
        steps = history[1][a]
        # nan_logprobs poisons row 0 only: the minibatch holding it is skipped, the rest train
        expected = 2 if kind == "nan_logprobs" else 4  # 2 epochs x 2 minibatches
        assert steps["skipped_batches"] == expected, steps
        assert steps["optimizer_steps"] == 4 - expected
        assert history[2][a]["skipped_batches"] == 0 and history[2][a]["optimizer_steps"] == 4
    if kind != "nan_logprobs":  # the skipped iteration left every weight as it was
        assert all(torch.equal(x, y) for x, y in zip(before, after_bad))
    assert all(torch.isfinite(w).all() for w in weights(trainer))
    assert not all(torch.equal(x, y) for x, y in zip(after_bad, weights(trainer)))
    assert trainer.iteration == 3
    beta = [m["llm_0"]["kl_coef"] for m in history]
    assert all(math.isfinite(b) for b in beta)


def test_out_of_memory_in_the_rollout_says_what_to_change(toy_lm, monkeypatch):
    trainer = Trainer(config(toy_lm, "cory"))

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(train_module, "rollout", oom)
    with pytest.raises(torch.OutOfMemoryError) as info:
        trainer.step()
    msg = str(info.value)
    assert "out of memory during the rollout" in msg and "Tried to allocate 20.00 GiB" in msg
    assert "batch_size=8" in msg and "ppo.mini_batch_size=4" in msg
    assert "batch_size=4 (now 8" in msg  # a smaller rollout batch
    assert "LoRA" in msg and "load_in_4bit=True" in msg and "placement" in msg
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)
    assert trainer.iteration == 0
    monkeypatch.undo()
    assert trainer.step()["iteration"] == 0  # nothing was half-done: the run can go on


def test_out_of_memory_in_the_update_suggests_gradient_accumulation(toy_lm, monkeypatch):
    trainer = Trainer(config(toy_lm, "cory", ppo={"grad_accum_steps": 1}))

    def oom(turns, iteration):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(trainer.learner, "update", oom)
    with pytest.raises(RuntimeError, match="out of memory during the update") as info:
        trainer.step()
    msg = str(info.value)
    assert "ppo.mini_batch_size=2, ppo.grad_accum_steps=2" in msg  # same optimizer batch
    assert "(now mini_batch_size=4, grad_accum_steps=1)" in msg


def test_other_errors_pass_through_unchanged(toy_lm, monkeypatch):
    trainer = Trainer(config(toy_lm, "cory"))

    def bad(turns, iteration):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(trainer.learner, "update", bad)
    with pytest.raises(RuntimeError, match="^shape mismatch$"):
        trainer.step()


def test_with_lora_and_4bit_the_advice_drops_them():
    from agents.llm.loading import LoraSettings

    cfg = config("unused", lora=LoraSettings(), load_in_4bit=True)
    advice = train_module.oom_advice(cfg, "update")
    assert "LoRA" not in advice and "load_in_4bit" not in advice
    assert "mini_batch_size=2" in advice


@pytest.mark.parametrize("change,message", [
    ({"task": "nope"}, "unknown task 'nope'; registered: .*'toy'"),
    ({"method": "sac"}, "unknown method 'sac'"),
    ({"batch_size": 10}, "batch_size=10 must be divisible by mini_batch_size"),
    ({"iterations": 0}, "iterations must be a positive integer, got 0"),
    ({"max_new_tokens": 0}, "max_new_tokens must be None or a positive integer"),
    ({"load_in_4bit": True}, "load_in_4bit=True needs LoRA"),
    ({"mixed_precision": "fp16"}, "mixed_precision must be one of .*, got 'fp16'"),
    ({"device": "gpu"}, "device='gpu' is not a device"),
    ({"placement": {"llm_2": "cpu"}}, "placement key 'llm_2' must be"),
    ({"placement": {"llm_1": "tpu0"}}, r"placement\['llm_1'\]='tpu0' is not a device"),
    ({"placement": {"llm_1": f"cuda:{torch.cuda.device_count()}"}},
     r"placement\['llm_1'\]='cuda:\d+' but \d+ CUDA device"),
])
def test_bad_config_fails_naming_the_field_before_any_model_loads(monkeypatch, change, message):
    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was checked")

    monkeypatch.setattr(train_module.LLMPolicy, "from_pretrained", no_load)
    monkeypatch.setattr(train_module, "default_model", no_load)
    cfg = config("unused-model", **{k: v for k, v in change.items()
                                    if k not in ("batch_size",)})
    if "batch_size" in change:
        cfg.batch_size = change["batch_size"]
    with pytest.raises(ValueError, match=message):
        Trainer(cfg)


def test_a_registered_task_instance_or_class_is_accepted():
    cfg = TrainConfig(task=ToyTask, method="cory")
    assert cfg.validate() is cfg
