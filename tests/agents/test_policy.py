"""agents.llm.policy: KV-cache decoding, rollout/training consistency, references, LoRA."""

import importlib.util
import os

import pytest
import torch
from helpers import needs_cxx
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from agents.llm import speed
from agents.llm.loading import LoraSettings
from agents.llm.policy import LLMPolicy
from agents.llm.sampling import DecodeState, SamplingConfig, sample_from_logprobs

V = 64
PAD = 0


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads; on a busy 2-core box they cost 5x."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """Tiny random GPT-2 and Llama checkpoints saved to disk (loaded back through HF)."""
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=PAD)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V,
                                      n_positions=64, initializer_range=0.2, **ids))
    llama = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, vocab_size=V,
                                         initializer_range=0.2, **ids))
    gpt2.save_pretrained(root / "gpt2")
    llama.save_pretrained(root / "llama")
    return {"gpt2": str(root / "gpt2"), "llama": str(root / "llama")}


def prompts(B=4, P=6, seed=0):
    """Left-padded random prompts: row i has i % 3 pad columns."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (B, P), generator=g)
    mask = torch.ones(B, P, dtype=torch.long)
    for i in range(B):
        mask[i, : i % 3] = 0
    return ids.masked_fill(mask == 0, PAD), mask


def rollout(policy, ids, mask, T, sampling, seed=0, end_at=None):
    """Decode T tokens; row r stops after step end_at[r] (as if it emitted EOS there)."""
    end_at = end_at or {}
    state = policy.begin(ids, mask, sampling)
    gen = torch.Generator().manual_seed(seed)
    active = torch.ones(ids.shape[0], dtype=torch.bool)
    steps, tokens, actives, logits = [], [], [], []
    for t in range(T):
        logits.append(state.logits.clone())
        step = policy.sample(state, gen)
        tok = torch.where(active, step.token, PAD)
        steps.append(step)
        tokens.append(tok)
        actives.append(active.clone())
        policy.feed(state, tok, active)
        for r, k in end_at.items():
            if t == k:
                active[r] = False
    full_ids = torch.cat([ids, torch.stack(tokens, 1)], 1)
    full_mask = torch.cat([mask, torch.stack(actives, 1).long()], 1)
    return steps, full_ids, full_mask, torch.stack(actives, 1), logits


def stack(steps, name):
    """Stack a Step field over time -> (B, T)."""
    return torch.stack([getattr(s, name) for s in steps], 1)


PLAIN = SamplingConfig()
PENALTY = SamplingConfig(temperature=0.7, repetition_penalty=1.3)
CASES = [(arch, lora, s) for arch in ("gpt2", "llama")
         for lora, s in ((False, PLAIN), (False, PENALTY), (True, PENALTY))]


CASE_IDS = [f"{a}-{'lora' if lo else 'full'}-{'plain' if s.is_identity else 'penalty'}"
            for a, lo, s in CASES]


@pytest.mark.parametrize("arch,lora,sampling", CASES, ids=CASE_IDS)
def test_rollout_matches_evaluate(model_dirs, arch, lora, sampling):
    """Per-step logprob / raw_logprob / value from decoding equal evaluate() on the sequence."""
    torch.manual_seed(0)
    policy = LLMPolicy.from_pretrained(model_dirs[arch], lora=LoraSettings(r=4) if lora else None)
    ids, mask = prompts()
    T = 8
    steps, full_ids, full_mask, act, _ = rollout(policy, ids, mask, T, sampling,
                                                 end_at={1: 2, 3: 4})
    assert not act[1, 3:].any() and act[1, :3].all()
    ev = policy.evaluate(full_ids, full_mask, T, sampling)
    for got, want in [(stack(steps, "logprob"), ev.logprobs),
                      (stack(steps, "raw_logprob"), ev.raw_logprobs),
                      (stack(steps, "value"), ev.values)]:
        torch.testing.assert_close(got[act], want[act], atol=1e-5, rtol=0)
    # The sampled distribution is really the transformed one when the sampling is not plain.
    lp, raw = stack(steps, "logprob"), stack(steps, "raw_logprob")
    assert torch.equal(lp, raw) == sampling.is_identity
    # Full raw log-softmax from the rollout equals the training pass too.
    ev_full = policy.evaluate(full_ids, full_mask, T, return_logsoftmax=True)
    got = torch.stack([s.logsoftmax for s in steps], 1)
    torch.testing.assert_close(got[act], ev_full.logsoftmax[act], atol=1e-5, rtol=0)
    assert (ev.logprobs[~act] == 0).all()  # masked positions are finite zeros


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_kv_cache_matches_full_recompute(model_dirs, arch):
    """Cached decoding logits/values equal a full forward over the sequence so far, every step."""
    policy = LLMPolicy.from_pretrained(model_dirs[arch], reference=None)
    ids, mask = prompts()
    sampling = SamplingConfig(repetition_penalty=1.1)
    state = policy.begin(ids, mask, sampling)
    gen = torch.Generator().manual_seed(1)
    active = torch.tensor([True, True, False, True])
    cur_ids = ids
    for _ in range(6):
        step = policy.sample(state, gen)
        policy.feed(state, step.token, active)
        cur_ids = torch.cat([cur_ids, torch.where(active, step.token, PAD)[:, None]], 1)
        with torch.no_grad():
            logits, values, _ = policy(cur_ids, state.mask)
        rows = active  # an inactive row's last column is a masked query: nothing to compare
        torch.testing.assert_close(state.logits[rows], logits[rows, -1], atol=1e-5, rtol=0)
        torch.testing.assert_close(state.value[rows], values[rows, -1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_chunked_prompt_pass_matches_one_pass(model_dirs, arch):
    """Filling the KV cache in column chunks gives the one-pass logits, values and decoding."""
    ids, mask = prompts(B=4, P=7)  # rows 1, 2 start with pad columns: a chunk of only padding
    sampling = SamplingConfig(repetition_penalty=1.1)
    runs = []
    for chunk_tokens in (None, 4, 8):  # one pass; 1 column a chunk; 2 columns a chunk
        torch.manual_seed(0)  # the same value head each time
        policy = LLMPolicy.from_pretrained(model_dirs[arch], reference=None)
        policy.prefill_chunk_tokens = chunk_tokens
        state = policy.begin(ids, mask, sampling, max_new_tokens=5)
        gen = torch.Generator().manual_seed(3)
        seen = [(state.logits.clone(), state.value.clone())]
        for _ in range(5):
            policy.feed(state, policy.sample(state, gen).token)
            seen.append((state.logits.clone(), state.value.clone()))
        runs.append(seen)
    for chunked in runs[1:]:
        for (logits, value), (want_logits, want_value) in zip(chunked, runs[0]):
            torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=0)
            torch.testing.assert_close(value, want_value, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_left_padding_invariance(model_dirs, arch):
    """A row's logits and values do not depend on how much left padding it carries."""
    policy = LLMPolicy.from_pretrained(model_dirs[arch], reference=None)
    ids, mask = prompts(B=3, P=8)
    with torch.no_grad():
        batch_logits, batch_values, _ = policy(ids, mask)
        for i in range(3):
            real = mask[i].bool()
            alone_logits, alone_values, _ = policy(ids[i:i + 1, real], mask[i:i + 1, real])
            torch.testing.assert_close(batch_logits[i, real], alone_logits[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(batch_values[i, real], alone_values[0], atol=1e-5, rtol=0)


def train_steps(policy, ids, mask, T, n=3, lr=1e-2):
    """A few Adam steps that push up the log-prob of the given responses, plus a value loss."""
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=lr)
    policy.train()
    for _ in range(n):
        ev = policy.evaluate(ids, mask, T)
        loss = -ev.logprobs.sum() + (ev.values - 1).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in policy.trainable_parameters()
                   if p.grad is not None)
        opt.step()
    policy.eval()


def sequences(policy, T=5, seed=0):
    """A sampled batch of full sequences (ids, mask) with a T-token response."""
    ids, mask = prompts(seed=seed)
    _, full_ids, full_mask, _, _ = rollout(policy, ids, mask, T, SamplingConfig(), seed=seed)
    return full_ids, full_mask


def test_copy_reference_stays_frozen(model_dirs):
    """A 'copy' reference is frozen, in eval mode, and unchanged by training the policy."""
    policy = LLMPolicy.from_pretrained(model_dirs["gpt2"])
    assert policy.reference_mode == "copy" and not policy.is_quantized
    assert not any(p.requires_grad for p in policy.ref_model.parameters())
    ids, mask = sequences(policy)
    ref0 = policy.reference_logsoftmax(ids, mask, 5, chunk_size=3)
    torch.testing.assert_close(ref0, policy.evaluate(ids, mask, 5, return_logsoftmax=True)
                               .logsoftmax.detach(), atol=1e-5, rtol=0)
    snapshot = {k: v.clone() for k, v in policy.ref_model.state_dict().items()}
    train_steps(policy, ids, mask, 5)
    policy.train()
    assert not policy.ref_model.training
    assert all(torch.equal(v, snapshot[k]) for k, v in policy.ref_model.state_dict().items())
    ref1 = policy.reference_logsoftmax(ids, mask, 5, chunk_size=3)
    torch.testing.assert_close(ref1, ref0, atol=0, rtol=0)
    new = policy.evaluate(ids, mask, 5, return_logsoftmax=True).logsoftmax
    assert (new - ref0).abs().max() > 1e-3
    assert not ref0.is_inference()  # usable inside autograd losses


def base_logsoftmax(path, ids, mask, T):
    """Log-softmax of the last T tokens under the plain HF model loaded from path."""
    base = AutoModelForCausalLM.from_pretrained(path)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = base(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    return torch.log_softmax(logits[:, -T - 1:-1].float(), -1)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_lora_adapter_reference(model_dirs, arch):
    """LoRA 'adapter' reference equals the base model; training moves the policy, not the ref."""
    policy = LLMPolicy.from_pretrained(model_dirs[arch], lora=LoraSettings(r=4))
    assert policy.reference_mode == "adapter" and policy.ref_model is None
    ids, mask = sequences(policy)
    base = base_logsoftmax(model_dirs[arch], ids, mask, 5)
    ref0 = policy.reference_logsoftmax(ids, mask, 5)
    torch.testing.assert_close(ref0, base, atol=1e-5, rtol=0)
    train_steps(policy, ids, mask, 5)
    assert all(p.requires_grad for p in policy.trainable_parameters())
    torch.testing.assert_close(policy.reference_logsoftmax(ids, mask, 5), base, atol=1e-5, rtol=0)
    new = policy.evaluate(ids, mask, 5, return_logsoftmax=True).logsoftmax
    assert (new - base).abs().max() > 1e-3


def test_shared_lora_two_adapters_on_one_base(model_dirs):
    """Two adapters on one base: disjoint trainables, independent updates, one base in memory."""
    path = model_dirs["gpt2"]
    pio, obs = LLMPolicy.shared_lora(path, LoraSettings(r=4))
    assert pio.model is obs.model and pio.adapter_name != obs.adapter_name
    tp, to = pio.trainable_parameters(), obs.trainable_parameters()
    assert not {id(p) for p in tp} & {id(p) for p in to}
    # Memory: the unique parameters of both policies are one base + two adapters + two heads.
    base_numel = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())
    unique = {p.data_ptr(): p.numel() for pol in (pio, obs) for p in pol.parameters()}
    assert sum(unique.values()) == base_numel + sum(p.numel() for p in tp + to)

    ids, mask = sequences(pio)
    base = base_logsoftmax(path, ids, mask, 5)
    before = obs.evaluate(ids, mask, 5)
    train_steps(pio, ids, mask, 5)
    after = obs.evaluate(ids, mask, 5)
    torch.testing.assert_close(after.logprobs, before.logprobs, atol=0, rtol=0)
    torch.testing.assert_close(after.values, before.values, atol=0, rtol=0)
    assert (pio.evaluate(ids, mask, 5).logprobs - before.logprobs).abs().max() > 1e-3
    for pol in (pio, obs):
        torch.testing.assert_close(pol.reference_logsoftmax(ids, mask, 5), base, atol=1e-5, rtol=0)
        assert all(p.requires_grad for p in tp + to)  # peft's re-enable froze the other adapter
    # Interleaved forwards: each backward reaches only its own adapter and head.
    loss_p = pio.evaluate(ids, mask, 5).logprobs.sum()
    loss_o = obs.evaluate(ids, mask, 5).logprobs.sum() + obs.evaluate(ids, mask, 5).values.sum()
    for p in tp + to:
        p.grad = None
    loss_p.backward()
    assert all(p.grad is None for p in to) and any(p.grad is not None for p in tp)
    loss_o.backward()
    assert all(p.grad is not None for p in to)
    assert all(p.requires_grad for p in tp + to)
    # Interleaved decoding: every cached step runs under its own adapter.
    ids, mask = prompts()
    states = [pol.begin(ids, mask, SamplingConfig()) for pol in (pio, obs)]
    gen = torch.Generator().manual_seed(0)
    steps = ([], [])
    for _ in range(4):
        for k, pol in enumerate((pio, obs)):
            steps[k].append(pol.sample(states[k], gen))
            pol.feed(states[k], steps[k][-1].token)
    for k, pol in enumerate((pio, obs)):
        full = torch.cat([ids, stack(steps[k], "token")], 1)
        ev = pol.evaluate(full, states[k].mask, 4)
        torch.testing.assert_close(stack(steps[k], "logprob"), ev.logprobs, atol=1e-5, rtol=0)
        torch.testing.assert_close(stack(steps[k], "value"), ev.values, atol=1e-5, rtol=0)


def test_4bit_without_cuda_fails_before_loading(model_dirs, monkeypatch):
    """4-bit loading raises a clear error on a CPU machine without touching the weights."""
    def boom(*a, **k):
        raise AssertionError("from_pretrained must not be called")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA GPU and bitsandbytes"):
        LLMPolicy.from_pretrained(model_dirs["gpt2"], lora=LoraSettings(), load_in_4bit=True)
    with pytest.raises(ValueError, match="LoRA"):
        LLMPolicy.from_pretrained(model_dirs["gpt2"], load_in_4bit=True)


@pytest.mark.parametrize("arch,lora", [("gpt2", False), ("llama", False), ("gpt2", True)])
def test_bf16_training_passes_on_the_cpu_use_eager_attention(model_dirs, arch, lora):
    """On the CPU a bf16 pass with grad runs eager attention (the SDPA CPU kernel's bf16
    backward is slow), any other pass SDPA; both compute the same function."""
    policy = LLMPolicy.from_pretrained(model_dirs[arch], lora=LoraSettings(r=4) if lora else None,
                                       reference=None)
    hf = policy.hf_model
    seen = []
    hf.base_model.register_forward_pre_hook(
        lambda module, args: seen.append(hf.config._attn_implementation))
    ids, mask = prompts(B=6, P=8)
    T, real = 3, mask[:, -3:].bool()
    fp32 = policy.evaluate(ids, mask, T)
    policy.mixed_precision = "bf16"
    assert policy.needs_recompute
    with torch.no_grad():
        sdpa = policy.evaluate(ids, mask, T)
    eager = policy.evaluate(ids, mask, T)
    assert seen == ["sdpa", "sdpa", "eager"] and hf.config._attn_implementation == "sdpa"
    assert eager.logprobs.dtype == torch.float32
    assert (eager.logprobs - fp32.logprobs)[real].abs().max() < 0.1  # bf16 rounding only
    assert (eager.logprobs - sdpa.logprobs)[real].abs().max() < 0.05
    (eager.logprobs[real].sum() + eager.values.sum()).backward()  # the eager pass trains
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in policy.trainable_parameters())
    if lora:  # its frozen base now holds bf16 weights: no way back to float32 passes
        with pytest.raises(ValueError, match="mixed_precision=None: .* stored in bf16"):
            policy.mixed_precision = None
    else:
        policy.mixed_precision = None
        policy.evaluate(ids, mask, T)
        assert seen[-1] == "sdpa" and not policy.needs_recompute
    with pytest.raises(ValueError, match="got 'fp16'"):
        policy.mixed_precision = "fp16"


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_bf16_autocast_stores_the_frozen_weights_in_bf16(model_dirs, arch, monkeypatch):
    """Under bf16 autocast a LoRA base's frozen matmul weights are kept in bf16 (autocast would
    round them on every pass anyway): rollouts, passes with grad and the reference give the
    same numbers, bit for bit, as with float32 storage; everything trainable stays float32."""
    import agents.llm.speed as policy_module

    def load(store: bool):
        if not store:
            monkeypatch.setattr(policy_module, "store_in_bf16", lambda modules: None)
        torch.manual_seed(0)
        pol = LLMPolicy.from_pretrained(model_dirs[arch], lora=LoraSettings(r=4),
                                        mixed_precision="bf16")
        monkeypatch.undo()
        return pol

    plain, lean = load(False), load(True)
    hf = lean.hf_model
    frozen = speed.frozen_matmuls(lean)
    assert frozen and all(m.weight.dtype == torch.bfloat16 for m in frozen)
    assert all(p.dtype == torch.float32 for p in lean.trainable_parameters())
    assert hf.get_input_embeddings().weight.dtype == torch.float32
    assert all(p.dtype == torch.float32 for n, p in hf.named_parameters() if "norm" in n
               or ".ln_" in n)
    assert all(m.weight.dtype == torch.float32 for m in speed.frozen_matmuls(plain))
    ids, mask = prompts(B=5, P=7)
    forced = torch.randint(3, V, (5, 4), generator=torch.Generator().manual_seed(1))
    outputs = []
    for pol in (plain, lean):
        state, logits = pol.begin(ids, mask, max_new_tokens=4), []
        for t in range(4):
            logits.append(state.logits)
            pol.feed(state, forced[:, t])
        full = torch.cat([ids, forced], 1)
        full_mask = torch.cat([mask, torch.ones_like(forced)], 1)
        ev = pol.evaluate(full, full_mask, 4)
        (ev.logprobs.sum() + ev.values.sum()).backward()
        grads = [p.grad for p in pol.trainable_parameters()]
        outputs.append([*logits, ev.logprobs, ev.values, ev.entropy, *grads,
                        pol.reference_logsoftmax(full, full_mask, 4)])
    for a, b in zip(*outputs):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="mixed_precision=None"):
        lean.mixed_precision = None
    lean.mixed_precision = "auto"  # stays bf16 on any device: its weights need it
    assert lean.amp_dtype == torch.bfloat16


def test_bf16_autocast_stores_a_reference_copy_in_bf16(model_dirs, monkeypatch):
    """Full fine-tuning keeps the policy in float32 and its frozen reference copy in bf16."""
    import agents.llm.speed as policy_module

    torch.manual_seed(0)
    lean = LLMPolicy.from_pretrained(model_dirs["gpt2"], mixed_precision="bf16")
    monkeypatch.setattr(policy_module, "store_in_bf16", lambda modules: None)
    plain = LLMPolicy.from_pretrained(model_dirs["gpt2"], mixed_precision="bf16")
    assert {p.dtype for p in lean.model.parameters()} == {torch.float32}
    assert {m.weight.dtype for m in speed.frozen_matmuls(lean)} == {torch.bfloat16}
    assert all(m.weight.dtype == torch.float32 for m in speed.frozen_matmuls(plain))
    ids, mask = prompts(B=5, P=9)
    assert torch.equal(lean.reference_logsoftmax(ids, mask, 3),
                       plain.reference_logsoftmax(ids, mask, 3))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_bf16_cpu_rollouts_keep_a_float32_kv_cache(model_dirs, arch):
    """Under CPU bf16 autocast the KV cache stores float32 (the CPU SDPA kernel is ~4x slower
    on a one-token bf16 query) and the query is cast up: decoding agrees with a cache in the
    model's dtype, and with float32, to bf16 rounding."""
    policy = LLMPolicy.from_pretrained(model_dirs[arch], reference=None, mixed_precision="bf16")
    hf = policy.hf_model
    ids, mask = prompts(B=5, P=7)
    forced = torch.randint(3, V, (5, 6), generator=torch.Generator().manual_seed(1))

    def decode():  # next-token logits along a fixed continuation; row 1 stops after 2 tokens
        state, logits = policy.begin(ids, mask, max_new_tokens=6), []
        for t in range(6):
            logits.append(state.logits)
            policy.feed(state, forced[:, t], torch.arange(5) != 1 if t >= 2 else None)
        return torch.stack(logits, 1), state.cache

    assert speed.kv_cache_dtype(policy) == torch.float32
    fast, cache = decode()
    assert cache.kv_dtype == torch.float32
    assert all(layer.keys.dtype == layer.values.dtype == torch.float32 for layer in cache.layers)
    assert hf.config._attn_implementation == "sdpa"  # the swap lasts one pass
    with pytest.MonkeyPatch.context() as mp:  # the cache in the model's dtype, as before
        mp.setattr(speed, "kv_cache_dtype", lambda policy: None)
        plain, cache = decode()
    assert cache.kv_dtype is None and cache.layers[0].values.dtype == torch.bfloat16
    policy.mixed_precision = None
    assert speed.kv_cache_dtype(policy) is None
    exact, _ = decode()  # float32 throughout
    scale = exact.abs().max()
    assert (fast - plain).abs().max() < 0.03 * scale  # bf16 rounding only
    assert (fast - exact).abs().max() < 0.03 * scale


@needs_cxx
def test_compiled_training_passes_match_eager_ones(model_dirs):
    """compile_training: passes with grad run a torch.compile'd backbone, with the same
    log-probs, values and gradients as eager; passes without grad stay eager."""
    policy = LLMPolicy.from_pretrained(model_dirs["gpt2"], lora=LoraSettings(r=4),
                                       reference=None)
    ids, mask = prompts(B=6, P=9)

    def pass_with_grad(width):
        for p in policy.trainable_parameters():
            p.grad = None
        out = policy.evaluate(ids[:, -width:], mask[:, -width:], 3, sampling=PENALTY)
        (out.logprobs.sum() + out.values.sum() + out.entropy.sum()).backward()
        return [out.logprobs, out.values, out.entropy] + \
            [p.grad.clone() for p in policy.trainable_parameters()]

    eager = [pass_with_grad(w) for w in (9, 7)]
    policy.compile_training = True
    with torch.no_grad():
        policy.evaluate(ids, mask, 3)
    assert not policy.__dict__.get("_compiled_bodies")  # no-grad passes stay eager
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    compiled = [pass_with_grad(w) for w in (9, 7)]  # two widths (one a strided slice)
    assert len(policy._compiled_bodies) == 1  # one wrapper...
    assert counters["stats"]["unique_graphs"] - graphs == 1  # ...and one dynamic-shape graph
    for a, b in zip(eager, compiled):
        for x, y in zip(a, b):
            torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available()
                    or importlib.util.find_spec("bitsandbytes") is None,
                    reason="needs a CUDA GPU and bitsandbytes")
def test_4bit_lora_on_cuda_rolls_out_trains_and_keeps_its_reference(model_dirs):
    """The paper's GSM8K setting in miniature: an nf4 base + LoRA on CUDA. Decoding agrees
    with evaluate() up to 4-bit/bf16 noise, training moves the adapter, not the base."""
    torch.manual_seed(0)
    policy = LLMPolicy.from_pretrained(model_dirs["llama"], lora=LoraSettings(r=4),
                                       load_in_4bit=True, device="cuda")
    assert policy.is_quantized and policy.needs_recompute and policy.device.type == "cuda"
    ids, mask = (x.cuda() for x in prompts())
    T = 5
    state = policy.begin(ids, mask)
    gen = torch.Generator(device="cuda").manual_seed(0)
    steps = []
    for _ in range(T):
        steps.append(policy.sample(state, gen))
        policy.feed(state, steps[-1].token)
    full_ids = torch.cat([ids, stack(steps, "token")], 1)
    full_mask = torch.cat([mask, torch.ones_like(mask[:, :T])], 1)
    ev = policy.evaluate(full_ids, full_mask, T)
    assert (stack(steps, "raw_logprob") - ev.raw_logprobs).abs().max() < 0.25  # bf16 noise
    ref0 = policy.reference_logsoftmax(full_ids, full_mask, T)
    base0 = [p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" not in n]
    before = ev.logprobs.sum().item()
    train_steps(policy, full_ids, full_mask, T, n=5)
    after = policy.evaluate(full_ids, full_mask, T).logprobs.sum().item()
    assert after > before + 0.5  # the adapters learned to push these tokens up
    base1 = [p.detach() for n, p in policy.model.named_parameters() if "lora_" not in n]
    assert all(torch.equal(a, b) for a, b in zip(base0, base1))
    torch.testing.assert_close(policy.reference_logsoftmax(full_ids, full_mask, T), ref0,
                               atol=1e-3, rtol=0)


def fixed_state(logits, n, sampling, seen=None):
    """A DecodeState holding one logits row repeated n times (no model needed to sample)."""
    rows = logits.expand(n, -1).clone()
    return DecodeState(cache=None, mask=torch.ones(n, 1, dtype=torch.long), logits=rows,
                       value=torch.zeros(n), seen=seen, sampling=sampling)


def test_sampling_matches_softmax_and_is_seeded(model_dirs):
    """Plain sampling follows softmax(logits); the same generator seed gives the same tokens."""
    policy = LLMPolicy.from_pretrained(model_dirs["gpt2"], reference=None)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, -30.0])
    n = 40000
    state = fixed_state(logits, n, SamplingConfig())
    step = policy.sample(state, torch.Generator().manual_seed(0))
    probs = logits.softmax(-1)
    counts = torch.bincount(step.token, minlength=8).float()
    chi2 = ((counts - n * probs) ** 2 / (n * probs)).sum()
    assert chi2 < 40, (chi2, counts)  # df = 7; P(chi2 > 40) ~ 1e-6
    torch.testing.assert_close(step.logprob, probs.log()[step.token], atol=1e-5, rtol=0)
    again = policy.sample(state, torch.Generator().manual_seed(0))
    other = policy.sample(state, torch.Generator().manual_seed(1))
    assert torch.equal(again.token, step.token) and not torch.equal(other.token, step.token)


def test_sampling_transforms(model_dirs):
    """Top-k / top-p never leave their kept set and logprob is that of the renormalised dist."""
    policy = LLMPolicy.from_pretrained(model_dirs["gpt2"], reference=None)
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    probs = logits.softmax(-1)
    gen = torch.Generator().manual_seed(0)
    step = policy.sample(fixed_state(logits, 5000, SamplingConfig(top_k=2)), gen)
    assert set(step.token.tolist()) == {0, 1}
    kept = probs[:2] / probs[:2].sum()
    torch.testing.assert_close(step.logprob, kept.log()[step.token], atol=1e-5, rtol=0)
    torch.testing.assert_close(step.raw_logprob, probs.log()[step.token], atol=1e-5, rtol=0)
    top_p = float(probs[:3].sum()) - 1e-3  # needs exactly the 3 most likely tokens
    step = policy.sample(fixed_state(logits, 5000, SamplingConfig(top_p=top_p)), gen)
    assert set(step.token.tolist()) == {0, 1, 2}
    # Repetition penalty only touches seen tokens: positive logits / p, negative logits * p.
    seen = torch.tensor([[True, False, False, False, True]]).expand(5000, -1).clone()
    sp = SamplingConfig(repetition_penalty=2.0)
    step = policy.sample(fixed_state(logits, 5000, sp, seen), gen)
    want = torch.log_softmax(torch.tensor([1.5, 2.0, 1.0, 0.0, -2.0]), -1)
    torch.testing.assert_close(step.logprob, want[step.token], atol=1e-5, rtol=0)
    # Zero-probability entries are never drawn by the inverse-CDF sampler.
    lp = torch.log_softmax(torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]]), -1)
    assert set(sample_from_logprobs(lp.expand(2000, -1), gen).tolist()) == {0, 2}


@pytest.mark.parametrize("vocab", [5, 300, 4096])
def test_inverse_cdf_draws_are_the_float64_inverse_cdfs(vocab):
    """The two-level sampler returns, for each row's u, the index a float64 running sum over
    the whole row would (blocks of 256 or fewer entries, a vocabulary short of a block, entries
    of probability 0), and its draws follow the distribution."""
    logits = torch.randn(4000, vocab, generator=torch.Generator().manual_seed(1)) * 3
    logits[:, 1::3] = float("-inf")
    lp = torch.log_softmax(logits, -1)
    token = sample_from_logprobs(lp, torch.Generator().manual_seed(0))
    u = torch.rand(4000, 1, generator=torch.Generator().manual_seed(0)).double()
    cdf = lp.double().exp().cumsum(-1)
    assert torch.equal(token, torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1))
    assert not (token % 3 == 1).any()
    row = torch.log_softmax(torch.tensor([2.0, 0.0, 1.0, -1.0]), -1)
    drawn = sample_from_logprobs(row.expand(20000, -1), torch.Generator().manual_seed(2))
    freq = torch.bincount(drawn, minlength=4) / 20000
    assert (freq - row.exp()).abs().max() < 0.01  # 4 sd of a binomial frequency


@pytest.mark.parametrize("lora", [False, True])
def test_save_load_round_trip(model_dirs, tmp_path, lora):
    """save() then load() into a fresh policy reproduces outputs; saving over a dir is atomic."""
    settings = LoraSettings(r=4) if lora else None
    policy = LLMPolicy.from_pretrained(model_dirs["gpt2"], lora=settings, reference=None)
    ids, mask = sequences(policy)
    train_steps(policy, ids, mask, 5, n=2)
    out = tmp_path / "ckpt"
    policy.save(str(out))
    policy.save(str(out))  # overwrite in place
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temp dirs left behind
    fresh = LLMPolicy.from_pretrained(model_dirs["gpt2"], lora=settings, reference=None)
    a, b = policy.evaluate(ids, mask, 5), fresh.evaluate(ids, mask, 5)
    assert (a.logprobs - b.logprobs).abs().max() > 1e-4
    params = [p for p in fresh.trainable_parameters()]
    fresh.load(str(out))
    assert all(p is q for p, q in zip(params, fresh.trainable_parameters(), strict=True))
    b = fresh.evaluate(ids, mask, 5)
    torch.testing.assert_close(b.logprobs, a.logprobs, atol=1e-6, rtol=0)
    torch.testing.assert_close(b.values, a.values, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_growing_cache_decodes_exactly_like_the_dynamic_cache(model_dirs, arch):
    """The in-place KV cache gives bit-identical logits to HF's DynamicCache, and after
    crop / batch_select_indices / batch_repeat_interleave it keeps working."""
    from transformers import DynamicCache

    from agents.llm.kvcache import GrowingLayer, growing_cache

    model = AutoModelForCausalLM.from_pretrained(model_dirs[arch]).eval()
    ids, mask = prompts(B=4, P=6)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)

    steps = 56 if arch == "gpt2" else 90  # llama: past the first buffer (6 + 64 slots)

    def decode(cache, edit=None):
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                    use_cache=True)
        m, last, logits = mask, out.logits[:, -1], []
        for t in range(steps):
            if edit is not None and t == 40:
                m, last = edit(cache, m, last)
            logits.append(last)
            m = torch.cat([m, torch.ones_like(m[:, :1])], 1)
            out = model(input_ids=last.argmax(-1, keepdim=True), attention_mask=m,
                        position_ids=m.sum(-1, keepdim=True) - 1, past_key_values=cache,
                        use_cache=True)
            last = out.logits[:, -1]
        return torch.cat([x.flatten() for x in logits])

    with torch.no_grad():
        cache = growing_cache()
        reference = decode(DynamicCache())
        assert torch.equal(decode(cache), reference)
        assert type(cache.layers[0]) is GrowingLayer and cache.get_seq_length() == 6 + steps
        for reserve in (6 + steps, 20):  # sized exactly once; too small: grows as without
            sized = growing_cache(reserve)
            assert torch.equal(decode(sized), reference)
            room = sized.layers[0].buffers[0].shape[2]
            assert room == 6 + steps if reserve > 20 else room > 6 + steps

        def select(cache, m, last):
            cache.batch_select_indices(torch.tensor([3, 1]))
            return m[[3, 1]], last[[3, 1]]

        def crop(cache, m, last):
            cache.crop(-5)
            return m[:, :-5], last

        for edit in (select, crop):
            assert torch.equal(decode(growing_cache(), edit=edit),
                               decode(DynamicCache(), edit=edit))
