"""The fast decode path (agents/llm/engine.py): the same distributions as the model's own decoding
up to bf16 rounding, folds that follow training and never touch a shared base, a fallback that
says why, and the rollout's mismatch log and truncated importance weights."""

import math

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from agents.learners.ppo import PPOBatch, policy_loss
from agents.learners.ppo_config import PPOConfig
from agents.learners.shaping import truncated_is_weights
from agents.llm.engine import DecodeEngine, StaticCache, attach
from agents.llm.loading import LoraSettings
from agents.llm.policy import LLMPolicy
from agents.llm.rollout import rollout
from agents.training.config import TrainConfig
from agents.training.train import Trainer
from cory_env.data.tokenizer import task_tokenizer

V = 96


def kl(p_logits, q_logits):
    """Largest row KL(p || q) of two (B, V) logit tensors."""
    lp, lq = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    return float((lp.exp() * (lp - lq)).sum(-1).max())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny random Llama, Gemma 3 (a sliding window of 4, shorter than the sequences) and
    GPT-2 folders."""
    root = tmp_path_factory.mktemp("engine")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=V, max_position_embeddings=128,
        tie_word_embeddings=True)).save_pretrained(root / "llama")
    Gemma3ForCausalLM(Gemma3TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, vocab_size=V, max_position_embeddings=128,
        sliding_window=4, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    ).save_pretrained(root / "gemma")
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=V, n_positions=64)
                    ).save_pretrained(root / "gpt2")
    return {k: str(root / k) for k in ("llama", "gemma", "gpt2")}


def lora_policy(path, names=None):
    """A LoRA r 4 policy in bf16 (or a shared-base team) with nonzero adapters."""
    kw = dict(mixed_precision="bf16")
    team = LLMPolicy.shared_lora(path, LoraSettings(r=4), names=names, **kw) if names else \
        (LLMPolicy.from_pretrained(path, lora=LoraSettings(r=4), **kw),)
    torch.manual_seed(1)
    for name, p in team[0].model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    return team


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_fast_path_draws_from_the_models_own_distribution(models, kind):
    (policy,) = lora_policy(models[kind])
    ids = torch.randint(3, V, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[1, :1] = 0  # left padding
    exact = policy.begin(ids, mask, max_new_tokens=8)
    engine = DecodeEngine(policy)
    fast = engine.begin(ids, mask, max_new_tokens=8)
    assert kl(exact.logits, fast.logits) < 1e-4
    for t in range(8):
        token = torch.randint(3, V, (3,), generator=torch.Generator().manual_seed(t))
        active = torch.tensor([True, t < 3, True])  # row 1 stops after 3 tokens
        policy.feed(exact, token, active)
        engine.feed(fast, token, active)
        rows = [0, 2] + ([1] if t < 3 else [])
        assert kl(exact.logits[rows], fast.logits[rows]) < 1e-4, t
    assert kl(exact.logits[[0, 2]], fast.logits[[2, 0]]) > 1e-3  # the check can fail


def test_the_policys_decode_steps_go_through_its_engine(models):
    (policy,) = lora_policy(models["llama"])
    ids = torch.randint(3, V, (2, 5))
    exact = policy.begin(ids, torch.ones_like(ids), max_new_tokens=2)
    assert attach(policy, "auto").startswith("fast")
    fast = policy.begin(ids, torch.ones_like(ids), max_new_tokens=2)
    assert isinstance(fast.cache, StaticCache) and not isinstance(exact.cache, StaticCache)
    policy.feed(fast, torch.tensor([5, 6]))
    assert fast.cache.size == 6 and fast.mask.shape == (2, 6)


def test_folding_follows_training_and_never_changes_the_shared_base(models):
    a, b = lora_policy(models["llama"], names=("llm_0", "llm_1"))
    base = {n: p.detach().clone() for n, p in a.hf_model.named_parameters() if "lora_" not in n}
    fast_a, fast_b = DecodeEngine(a), DecodeEngine(b)
    ids = torch.randint(3, V, (2, 6))
    mask = torch.ones_like(ids)
    before = fast_a.begin(ids, mask).logits
    fast_b.begin(ids, mask)  # one engine's copies are held at a time: b's fold releases a's
    assert fast_a.layers == [] and fast_b.layers
    fast_b.begin(ids, mask)
    folds = fast_a.folds, fast_b.folds
    assert folds[1] == 1  # nothing trained, still held: no new fold
    opt = torch.optim.SGD(a.trainable_parameters(), lr=0.5)  # one step on llm_0's adapter only
    logits, _, _ = a(ids, mask)
    logits[:, -1, 7].sum().backward()
    opt.step()
    assert fast_b.begin(ids, mask) and fast_b.folds == folds[1]  # b's weights did not move
    after = fast_a.begin(ids, mask).logits
    assert fast_a.folds == folds[0] + 1 and fast_b.layers == []
    assert kl(after, before) > 1e-4  # the new adapter is decoded
    assert kl(a.begin(ids, mask).logits, after) < 1e-4  # and matches the trainer's model
    for n, p in a.hf_model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base[n]), n  # folded into copies, never in place
    fast_a.release()
    assert fast_a.layers == [] and fast_a.head is None
    assert kl(fast_a.begin(ids, mask).logits, after) == 0.0 and fast_a.folds == folds[0] + 2
    del fast_a  # an engine that is gone holds nothing and is released by no one
    assert fast_b.begin(ids, mask) and fast_b.folds == folds[1] + 1


def test_auto_falls_back_saying_why_and_fast_refuses(models):
    gpt2 = LLMPolicy.from_pretrained(models["gpt2"], lora=LoraSettings(r=4),
                                     mixed_precision="bf16")
    said = attach(gpt2, "auto")
    assert gpt2.engine is None and "exact" in said and "'gpt2'" in said
    fp32 = LLMPolicy.from_pretrained(models["llama"], lora=LoraSettings(r=4),
                                     mixed_precision=None)
    assert "float32" in attach(fp32, "auto") and fp32.engine is None
    with pytest.raises(ValueError, match="decode='fast' cannot run this model: float32"):
        attach(fp32, "fast")
    (policy,) = lora_policy(models["llama"])
    assert attach(policy, "exact") == "exact decode path (decode=exact)" and policy.engine is None
    with pytest.raises(ValueError, match="TrainConfig.decode must be one of .* got 'fastest'"):
        TrainConfig(decode="fastest").validate()


def test_truncated_importance_weights_by_hand():
    class T:  # a turn's fields
        logprobs = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
        sampler_logprobs = torch.tensor([[-1.5, -1.0, -0.5, 0.0]])
        response_mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])

    w = truncated_is_weights(T, cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, math.exp(-1.0), 1.0, 0.0]]))  # e^0.5 > cap
    T.sampler_logprobs = None
    assert truncated_is_weights(T, 1.5) is None  # the exact path: no weights at all


def test_policy_loss_weighs_each_tokens_term():
    lp, old = torch.tensor([[-1.0, -0.8]]), torch.tensor([[-1.0, -1.0]])
    adv, mask = torch.tensor([[1.0, -2.0]]), torch.ones(1, 2)
    plain, _ = policy_loss(lp, old, adv, mask, 0.2)
    same, _ = policy_loss(lp, old, adv, mask, 0.2, is_weights=torch.ones(1, 2))
    assert torch.equal(plain, same)
    r = math.exp(0.2)  # token 2: ratio e^0.2 > 1.2 with A < 0: the unclipped term, 2 r
    weighed, _ = policy_loss(lp, old, adv, mask, 0.2, is_weights=torch.tensor([[0.5, 2.0]]))
    assert weighed.item() == pytest.approx((0.5 * -1.0 + 2.0 * 2 * r) / 2)
    assert "is_weights" in PPOBatch.__dataclass_fields__


@pytest.fixture(scope="module")
def task_llama(tmp_path_factory):
    """A tiny Llama over the offline sentiment task's vocabulary."""
    tok = task_tokenizer("sentiment")
    path = tmp_path_factory.mktemp("taskllama") / "llama"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=256,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)).save_pretrained(path)
    return str(path)


def run(path, decode, iterations=2):
    """Metrics of a short CORY run on the tiny Llama (LoRA, bf16)."""
    cfg = TrainConfig(task="sentiment", method="cory", model=path, iterations=iterations,
                      batch_size=4, max_new_tokens=4, lora=LoraSettings(r=4),
                      mixed_precision="bf16", decode=decode, seed=3,
                      ppo=PPOConfig(mini_batch_size=4, ppo_epochs=1))
    trainer = Trainer(cfg)
    return trainer, [trainer.step() for _ in range(iterations)]


def test_fast_rollouts_log_the_mismatch_and_weigh_the_loss(task_llama):
    trainer, steps = run(task_llama, "fast")
    for metrics in steps:
        for agent in ("llm_0", "llm_1"):
            assert 0.0 <= metrics[agent]["sampler_kl"] < 1e-3  # logged every iteration
            assert metrics[agent]["sampler_ratio_max"] > 0.0
            assert 0.0 < metrics[agent]["is_weight"] <= 2.0  # the weights' mean, as trained
    policy = trainer.learner.policies["llm_0"]
    assert policy.engine is not None and policy.engine.folds >= 2  # folded again after updates
    turns = rollout(trainer.env, trainer.learner.policies, trainer.learner.sampling,
                    trainer.learner.generator)
    batch = trainer.learner.agents["llm_0"].batch(turns["llm_0"])
    assert torch.equal(batch.is_weights, truncated_is_weights(turns["llm_0"], 2.0))
    assert batch.is_weights.max() <= 2.0 and (batch.is_weights > 0).any()
    exact, steps = run(task_llama, "exact")
    assert all("sampler_kl" not in m[a] for m in steps for a in ("llm_0", "llm_1"))
    assert exact.learner.policies["llm_0"].engine is None


def test_auto_is_the_default_and_a_folders_choice_is_kept():
    import dataclasses

    from benchmarks.settings.config import BenchConfig, from_saved

    saved = dataclasses.asdict(BenchConfig())
    assert saved["train"]["decode"] == "auto" == TrainConfig().decode
    saved["train"]["decode"] = "fast"
    assert from_saved(saved).train.decode == "fast"  # a folder that chose, keeps its choice
    del saved["train"]["decode"]  # written before the fast path existed: the exact one
    assert from_saved(saved).train.decode == "exact"


def test_fast_alone_answers_are_scored_from_the_drawn_distributions(task_llama):
    import numpy as np

    from agents.llm.rollout import answer_alone
    from cory_env import BatchedCoryEnv

    trainer, _ = run(task_llama, "fast", iterations=1)
    policy = trainer.learner.policies["llm_0"]
    env = BatchedCoryEnv(batch_size=4, task=trainer.env.task, tokenizer=trainer.env.tokenizer,
                         max_new_tokens=4, split="test", n_agents=1, seed=0)
    queries = list(range(10))
    fast = answer_alone(env, policy, trainer.cfg.sampling, torch.Generator().manual_seed(2),
                        queries)
    attach(policy, "exact")
    exact = answer_alone(env, policy, trainer.cfg.sampling, torch.Generator().manual_seed(2),
                         queries)
    assert np.array_equal(fast[0], exact[0])  # the same answers drawn (bf16 rounding aside)
    np.testing.assert_allclose(fast[1], exact[1], rtol=0.02, atol=1e-3)


def test_an_untrained_adapters_alone_kl_is_zero_on_the_fast_path(task_llama):
    """The fast path draws the answers; full passes of the model and of its base score their
    KL, as on the exact path: an adapter that has not moved (B = 0) reads ΣKL 0, not the two
    paths' gap."""
    import numpy as np

    from agents.llm.rollout import answer_alone
    from cory_env import BatchedCoryEnv

    trainer = Trainer(TrainConfig(task="sentiment", method="ppo", model=task_llama, iterations=1,
                                  batch_size=4, max_new_tokens=4, lora=LoraSettings(r=4),
                                  mixed_precision="bf16", decode="fast", seed=3))
    policy = trainer.learner.policies["llm_0"]
    assert policy.engine is not None
    env = BatchedCoryEnv(batch_size=4, task=trainer.env.task, tokenizer=trainer.env.tokenizer,
                         max_new_tokens=4, split="test", n_agents=1, seed=0)
    _, kls = answer_alone(env, policy, trainer.cfg.sampling, torch.Generator().manual_seed(2),
                          list(range(8)))
    assert np.abs(kls).max() < 1e-5
    trainer.step()  # the adapter moves: the base's engine keeps the base
    _, moved = answer_alone(env, policy, trainer.cfg.sampling, torch.Generator().manual_seed(2),
                            list(range(8)))
    assert moved.max() > 10 * max(np.abs(kls).max(), 1e-6)
