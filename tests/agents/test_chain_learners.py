"""Learners on K-agent chains: rotation through every position, MAPPO's joint critic, group
learners, K = 2 unchanged, and heterogeneous agents (a model or a LoRA adapter per agent)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers import ToyTask, save_toy_lm, toy_tokenizer

import cory_env
from agents.learners.cory import rotation
from agents.learners.mappo import joint_sequence
from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.llm.loading import LoraSettings
from agents.training.config import TrainConfig
from agents.training.train import Trainer

cory_env.register_task("toy", ToyTask)


def config(model, method="cory", **kw):
    ppo = PPOConfig(mini_batch_size=8, lr=3e-3, kl=KLConfig(coef=0.05))
    return TrainConfig(task="toy", method=method, model=model, batch_size=8, ppo=ppo,
                       iterations=kw.pop("iterations", 3), **kw)


def numbers(rows):
    return [{k: v for k, v in m.items() if not k.startswith("time_")} for m in rows]


def test_rotation_schedule_visits_every_position():
    assert [rotation(i, 2, 3) for i in range(8)] == [0, 0, 1, 1, 2, 2, 0, 0]
    assert [rotation(i, 5) for i in range(11)] == [0] * 5 + [1] * 5 + [0]


def test_cory_rotates_k_models_through_the_chain(toy_lm):
    trainer = Trainer(config(toy_lm, n_agents=3, t_rex=1, iterations=4))
    assert sorted(trainer.learner.policies) == ["llm_0", "llm_1", "llm_2"]
    rows = list(trainer.run())
    for m in rows:
        r = m["iteration"] % 3
        assert m["rotation"] == r
        for k, role in enumerate(["pioneer", "observer_1", "observer_2"]):
            agent = f"llm_{(k + r) % 3}"
            assert m[agent]["role"] == role and m[agent]["position"] == k
        team = sum(m[f"llm_{i}"]["task_reward"] for i in range(3))
        assert m["llm_0"]["collective_reward"] == pytest.approx(team, abs=1e-5)
    again = Trainer(config(toy_lm, n_agents=3, t_rex=1, iterations=4))
    assert numbers(again.run()) == numbers(rows)  # deterministic under the seed


def test_k2_is_todays_cory(toy_lm):
    default = numbers(Trainer(config(toy_lm, t_rex=1)).run())
    assert numbers(Trainer(config(toy_lm, t_rex=1, n_agents=2)).run()) == default
    assert [m["rotation"] for m in default] == [0, 1, 0]


@pytest.mark.parametrize("method", ["cory-mappo", "cory-grpo", "ippo"])
def test_multi_agent_learners_train_k3(toy_lm, method):
    kw = {"group_size": 2} if method == "cory-grpo" else {}
    trainer = Trainer(config(toy_lm, method, n_agents=3, t_rex=1, iterations=2, **kw))
    for m in trainer.run():
        assert {f"llm_{i}" for i in range(3)} <= set(m)
        for i in range(3):
            assert torch.isfinite(torch.tensor(m[f"llm_{i}"]["policy_loss"]))
        if method == "cory-mappo":
            assert m["llm_0"]["critic_value_loss"] == m["llm_2"]["critic_value_loss"]


def test_joint_sequence_of_three_turns():
    class T:  # the Turn fields joint_sequence reads
        def __init__(self, ids, mask, rmask):
            self.input_ids, self.attention_mask = torch.tensor(ids), torch.tensor(mask)
            self.response_mask = torch.tensor(rmask, dtype=torch.float)

    pio = T([[0, 5, 6, 7]], [[0, 1, 1, 1]], [[1, 1]])  # prompt 5, answer 6 7
    obs1 = T([[5, 6, 8, 0]], [[1, 1, 1, 0]], [[1, 0]])  # answer 8 (then padding)
    obs2 = T([[5, 8, 9, 4]], [[1, 1, 1, 1]], [[1, 1]])  # answer 9 4
    ids, mask, rmask, cols = joint_sequence(pio, obs1, obs2)
    assert ids[mask.bool()].tolist() == [5, 6, 7, 8, 9, 4]
    assert rmask.tolist() == [[1, 1, 1, 0, 1, 1]]
    valid = cols[rmask.bool()]
    # each response token is predicted from the position just before it in the joint sequence
    assert ids.gather(1, (valid + 1)[None]).tolist() == [[6, 7, 8, 9, 4]]


def test_n_agents_is_checked_before_any_model_loads(toy_lm):
    with pytest.raises(ValueError, match="single-agent learner: n_agents=3"):
        config(toy_lm, "ppo", n_agents=3).validate()
    with pytest.raises(ValueError, match="n_agents=1 must be >= 2"):
        config(toy_lm, "cory", n_agents=1).validate()
    with pytest.raises(ValueError, match="models key 'llm_3' is not an agent"):
        config(toy_lm, n_agents=3, models={"llm_3": toy_lm}).validate()
    with pytest.raises(ValueError, match="placement key 'llm_2'"):
        config(toy_lm, placement={"llm_2": "cpu"}).validate()


def other_lm(path, seed=1) -> str:
    """A second toy GPT-2 with the same tokenizer but other weights."""
    from transformers import GPT2LMHeadModel

    save_toy_lm(path)
    torch.manual_seed(seed)
    lm = GPT2LMHeadModel.from_pretrained(path)
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    lm.save_pretrained(path)
    return str(path)


def test_heterogeneous_models_each_with_its_own_reference(toy_lm, tmp_path):
    other = other_lm(tmp_path / "other")
    assert config(toy_lm, models=[None, other]).validate().models == {"llm_1": other}
    trainer = Trainer(config(toy_lm, n_agents=3, models={"llm_1": other}, iterations=1))
    pols = trainer.learner.policies
    w = {a: p.hf_model.transformer.wte.weight for a, p in pols.items()}
    assert torch.equal(w["llm_0"], w["llm_2"]) and not torch.equal(w["llm_0"], w["llm_1"])
    assert torch.equal(pols["llm_1"].ref_model.transformer.wte.weight, w["llm_1"])
    assert pols["llm_0"].ref_model is pols["llm_2"].ref_model  # same start, one reference
    m = trainer.step()
    for a in pols:  # the first rollout is the initial model: zero KL to its own reference
        assert m[a]["kl"] == pytest.approx(0.0, abs=1e-5)


def test_agents_not_named_in_models_start_from_model(toy_lm, tmp_path, monkeypatch):
    other = other_lm(tmp_path / "other")
    monkeypatch.setattr("agents.training.train.default_model", lambda task: toy_lm)  # offline LM
    trainer = Trainer(config(None, "cory-mappo", models={"llm_0": other}, iterations=1))
    pols = trainer.learner.policies
    wte = {a: p.hf_model.transformer.wte.weight for a, p in pols.items()}
    offline = Trainer(config(toy_lm, iterations=1)).learner.policies["llm_0"]
    assert torch.equal(wte["llm_1"], offline.hf_model.transformer.wte.weight)
    assert not torch.equal(wte["llm_0"], wte["llm_1"])
    assert torch.equal(trainer.learner.critic.hf_model.transformer.wte.weight, wte["llm_0"])


def test_agents_with_different_tokenizers_are_refused(toy_lm, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    other = other_lm(tmp_path / "other")
    words = list(reversed(toy_tokenizer().get_vocab()))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>",
                            pad_token="<eos>").save_pretrained(other)
    with pytest.raises(ValueError, match="llm_1's model .* and llm_0's model .* have different "
                                         "tokenizers"):
        Trainer(config(toy_lm, models={"llm_1": other}))
    bare = tmp_path / "bare"  # a model folder without a tokenizer: the env uses the task's
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(toy_lm) / name, bare / name)
    with pytest.raises(ValueError, match="llm_2's model .* and the task's tokenizer"):
        Trainer(config(str(bare), n_agents=3, models={"llm_2": other}))


def lora_adapter(base: str, path, seed=2) -> str:
    """A PEFT adapter folder on the toy LM with non-zero weights (it changes the model)."""
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    lm = get_peft_model(GPT2LMHeadModel.from_pretrained(base),
                        LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn"]))
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    lm.save_pretrained(path)
    return str(path)


def test_a_lora_adapter_per_agent_on_one_base(toy_lm, tmp_path):
    adapter = lora_adapter(toy_lm, tmp_path / "adapter")
    trainer = Trainer(config(toy_lm, n_agents=3, lora=LoraSettings(r=2), iterations=2,
                             adapters={"llm_2": adapter}))
    pols = trainer.learner.policies
    assert pols["llm_0"].model is pols["llm_2"].model  # one base
    ids = torch.tensor([[1, 2, 3, 4]])
    mask = torch.ones_like(ids)
    out = {a: p.reference_logsoftmax(ids, mask, 2) for a, p in pols.items()}
    assert torch.equal(out["llm_0"], out["llm_1"])  # fresh adapters: the base is the reference
    assert not torch.allclose(out["llm_0"], out["llm_2"])  # llm_2's reference: its adapter
    rows = list(trainer.run())
    assert rows[0]["llm_2"]["kl"] == pytest.approx(0.0, abs=1e-5)
    trainable = {id(p) for p in pols["llm_2"].trainable_parameters()}
    frozen = [p for n, p in pols["llm_2"].model.named_parameters() if ".ref_llm_2." in n]
    assert frozen and not any(id(p) in trainable or p.requires_grad for p in frozen)
    assert rows[1]["llm_2"]["kl"] > 0  # it trained away from its own start


def test_k_adapters_on_one_base_add_only_the_adapters(toy_lm):
    from agents.llm.policy import LLMPolicy

    def unique_numel(k):
        team = LLMPolicy.shared_lora(toy_lm, LoraSettings(r=2), names=[f"llm_{i}" for i in
                                                                    range(k)])
        params = {id(p): p.numel() for pol in team for p in pol.parameters()}
        adapter = sum(p.numel() for n, p in team[0].model.named_parameters()
                      if ".llm_0." in n)
        return sum(params.values()), adapter, team[0].value_head.weight.numel() + 1

    two, adapter, head = unique_numel(2)
    four, _, _ = unique_numel(4)
    assert four - two == 2 * (adapter + head)


def test_every_position_after_the_pioneer_reports_its_copy_rate(monkeypatch):
    """The learner's own metrics (not a patch in the benchmark) carry how often each position
    repeated the previous position's answer verbatim."""
    from types import SimpleNamespace

    import agents.learners.learner as base

    learner = base.Learner.__new__(base.Learner)
    learner.agents, learner.cfg = {}, SimpleNamespace(report_kl_coef=0.0)
    monkeypatch.setattr(base, "turn_metrics", lambda turn, coef: {})
    turns = {a: SimpleNamespace(position=k, texts=texts, agent=a, task_reward=torch.zeros(2))
             for k, (a, texts) in enumerate([("llm_1", ["red", "blue"]),
                                             ("llm_0", ["red", "green"]),
                                             ("llm_2", ["red", "green"])])}
    out = learner.metrics(turns, {})
    assert "copy_rate" not in out["llm_1"]
    assert out["llm_0"]["copy_rate"] == 0.5 and out["llm_2"]["copy_rate"] == 1.0
