"""LLM policy for token-level PPO: a Hugging Face causal LM plus a scalar value head.

Sequence layout (shared with the environment): a batch is (B, L) `input_ids` + `attention_mask`;
the prompt is left-padded and fills columns 0..P-1, the response fills P..P+T-1 (positions after
EOS are masked 0). Position ids always come from the mask (cumsum - 1, clamped at 0), so left
padding never shifts positions.

Rollout (all under `torch.inference_mode()`, one forward of length 1 per new token, and a KV
cache that appends in place, `cory_env.offline.kvcache.growing_cache`):

    state = policy.begin(prompt_ids, prompt_mask, sampling)
    for t in range(T):
        step = policy.sample(state, generator)     # token, logprob, raw_logprob, value, logsoftmax
        policy.feed(state, step.token, active)     # active: rows still generating this token
    ref = policy.reference_logsoftmax(ids, mask, T)  # ONE batched reference pass per turn

The reference KL is meant to be computed from that single batched pass after the turn (then
KL_t = sum_v exp(step.logsoftmax) * (step.logsoftmax - ref[:, t])): one big forward is cheaper
than T streamed single-token reference steps and needs no second KV cache.

Training: `evaluate(ids, mask, T, sampling)` recomputes, with grad, the same log-probs (under the
same sampling transform: repetition penalty, temperature, top-k, top-p), the raw log-probs, values
and entropies. The value for token t is read from the hidden state that predicts token t, both
here and in `sample`.

With a 4-bit (bitsandbytes) base the single-token cached step and the full pass run different
kernels, so decode-time log-probs differ from `evaluate` (about 0.1 nat on a tiny random Llama on
an H200; fp32 and bf16 agree to 1e-5). When `policy.needs_recompute` (4-bit, or bf16 autocast),
recompute the old log-probs and values with `evaluate` under `torch.no_grad()` before the PPO
epochs; it matches the grad pass (PPOAgent does this unless `PPOConfig.old_logprobs` says
"sampler"; under CPU bf16 autocast the sampler's log-probs differ from the training pass's by
about 1e-3 nat on average, 8e-3 at most, on the perf workload).

Speed: every pass first drops the leading columns that are padding in every row (exact, since
positions come from the mask), GPT-2's Python tanh-GELU is swapped for the fused kernel, and on
a CUDA GPU all passes run under bf16 autocast (`mixed_precision="auto"`; the value head stays
float32). On a CPU, `mixed_precision="bf16"` opts in to bf16 autocast; its passes with grad then
use eager attention, since the CPU SDPA kernel's bf16 backward is slow, and its rollouts keep the
KV cache in float32, since that kernel is also slow on a one-token bf16 query. Under bf16
autocast the frozen matmul weights (a LoRA base, a reference copy) are stored in bf16: autocast
rounds them to bf16 on every pass anyway, so the numbers are the same without the per-pass cast.
`compile_training=True` (`TrainConfig.torch_compile`) runs the backbone of every pass with grad
through `torch.compile` (dynamic shapes, compiled on first use).

Repetition penalty follows the usual rule (seen logit < 0: times penalty, else divided by it), but
"seen" means attended context tokens only (prompt tokens with mask 1 and earlier response tokens),
not left padding. Dropout is switched off by default (`disable_dropout=True`) so the PPO ratio is
exactly 1 before the first update; that also zeroes LoRA dropout. Top-k/top-p are supported for
training, but a sampled token that falls just outside the kept set in the recomputation (float
noise at the boundary) gets log-prob -inf; the paper trains with top_k=0, top_p=1.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import json
import os
import shutil
import tempfile
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from cory_env.offline.kvcache import QUERY_TO_KV_SDPA, growing_cache


@dataclass
class SamplingConfig:
    """How next tokens are drawn (paper: top_k 0, top_p 1; IMDB code: repetition_penalty 1.1)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self):
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0 or self.repetition_penalty <= 0:
            raise ValueError("top_k must be >= 0 and repetition_penalty > 0")

    @property
    def is_identity(self) -> bool:
        """True when sampling is plain softmax sampling from the policy."""
        return (self.temperature == 1.0 and self.top_k == 0 and self.top_p == 1.0
                and self.repetition_penalty == 1.0)


@dataclass
class LoraSettings:
    """LoRA hyper-parameters; target_modules None means peft's default for the architecture."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] | None = None


@dataclass
class DecodeState:
    """Incremental decoding state: KV cache, mask so far, next-token logits/value, seen tokens."""

    cache: object
    mask: torch.Tensor  # (B, L) attention mask of everything in the cache
    logits: torch.Tensor  # (B, V) float32 logits for the next token
    value: torch.Tensor  # (B,) value of the current state
    seen: torch.Tensor | None  # (B, V) bool attended context tokens (repetition penalty only)
    sampling: SamplingConfig


@dataclass
class Step:
    """One sampled token per row, with its log-probs, the state value and the raw log-softmax."""

    token: torch.Tensor  # (B,) long
    logprob: torch.Tensor  # (B,) under the distribution actually sampled from
    raw_logprob: torch.Tensor  # (B,) under the untransformed policy
    value: torch.Tensor  # (B,)
    logsoftmax: torch.Tensor  # (B, V) raw policy log-softmax


@dataclass
class Evaluation:
    """Per-response-token outputs of a full (B, L) pass; all (B, T) except logsoftmax."""

    logprobs: torch.Tensor
    raw_logprobs: torch.Tensor
    values: torch.Tensor
    entropy: torch.Tensor  # of the raw (untransformed) policy
    logsoftmax: torch.Tensor | None = None  # (B, T, V) raw, when asked for


MIXED_PRECISION = ("auto", "bf16", None)


def check_mixed_precision(value) -> None:
    """Raise ValueError naming `value` unless it is one of MIXED_PRECISION."""
    if value not in MIXED_PRECISION:
        raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {value!r}")

# ----------------------------------------------------------------------------- helpers

def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding: cumsum(mask) - 1, clamped at 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def first_seen(ids: torch.Tensor, mask: torch.Tensor, n_response: int, vocab: int) -> torch.Tensor:
    """(B, V) first response step that has token v in its context (T + 1 if never).

    Prompt tokens count as seen from step 0; response token j is in the context of steps > j.
    Masked tokens never count. Then "v is seen at step t" is simply `first[:, v] <= t`.
    """
    B, L = ids.shape
    P = L - n_response
    idx = torch.where(mask.bool(), ids, vocab)  # masked tokens go to a dump column
    src = torch.arange(L, device=ids.device) - P + 1  # prompt -> <= 0, response j -> j + 1
    src = src.clamp(min=0).expand(B, L)
    first = torch.full((B, vocab + 1), n_response + 1, dtype=torch.long, device=ids.device)
    first.scatter_reduce_(1, idx, src, reduce="amin")
    return first[:, :vocab]


def transform_logits(logits: torch.Tensor, seen: torch.Tensor | None, s: SamplingConfig):
    """Apply repetition penalty, temperature, top-k and top-p (in that order) over the last dim."""
    if s.repetition_penalty != 1.0 and seen is not None:
        p = s.repetition_penalty
        with torch.no_grad():  # a piecewise-constant factor: one multiply, cheap backward
            factor = torch.where(logits < 0, p, 1.0 / p).masked_fill_(~seen, 1.0)
        logits = logits * factor
    if s.temperature != 1.0:
        logits = logits / s.temperature
    if 0 < s.top_k < logits.shape[-1]:
        kth = logits.topk(s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = (probs.cumsum(-1) - probs) >= s.top_p  # mass strictly above the token >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def sample_from_logprobs(logp: torch.Tensor, generator: torch.Generator | None = None):
    """Inverse-CDF sampling of one index per row of (B, V) log-probs (10x faster than multinomial).

    Zero-probability entries can never be drawn: the first index whose CDF exceeds u is returned.
    """
    cdf = logp.exp().cumsum(-1)
    where = generator.device if generator is not None else cdf.device  # a CPU generator works too
    u = torch.rand(cdf.shape[0], 1, generator=generator, device=where, dtype=cdf.dtype)
    u = u.to(cdf.device)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return token.squeeze(-1).clamp(max=cdf.shape[-1] - 1)


# cuDNN's fused attention returns NaN gradients in bf16 when a query row is all padding (the
# left-padded prompts here): seen on an H200 with torch 2.11, where it made PPO skip most
# minibatches. The other SDPA kernels handle such rows.
_SDPA_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _set_attention(hf: nn.Module, name: str) -> None:
    """Switch an HF model's attention implementation ("sdpa", "eager", ...).

    Where every sub-model reads the one top-level config (GPT-2, Llama, ...), setting it there
    is enough; `set_attn_implementation` walks every module, 0.4 ms a call on the perf model.
    """
    if not hasattr(hf, "set_attn_implementation") or _one_config(hf):  # or transformers < 4.48
        hf.config._attn_implementation = name
    else:
        hf.set_attn_implementation(name)


def _one_config(hf: nn.Module) -> bool:
    """Whether every sub-model of `hf` reads `hf.config`, which has no sub-configs (cached)."""
    if "_cory_one_config" not in hf.__dict__:
        from transformers import PreTrainedModel

        hf.__dict__["_cory_one_config"] = not getattr(hf.config, "sub_configs", None) and all(
            m.config is hf.config for m in hf.modules() if isinstance(m, PreTrainedModel))
    return hf.__dict__["_cory_one_config"]


def _cache_kwarg(model: nn.Module) -> str:
    """Name of the KV-cache argument: `cache` in transformers >= 5.2x, else `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability in the model to 0 (PPO ratios must be deterministic)."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):  # Llama-style attention
            m.attention_dropout = 0.0


class _TanhGELU(nn.Module):
    """The tanh-approximated GELU of GPT-2 (`gelu_new`) as PyTorch's fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


def _fuse_gelu(model: nn.Module) -> None:
    """Swap transformers' Python `NewGELUActivation` (6 ops) for one fused op (same formula).

    Outputs agree to ~2e-7; a GPT-2 training step gets about 5-10% faster on CPU.
    """
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child).__name__ == "NewGELUActivation":
                setattr(module, name, _TanhGELU())


def _store_in_bf16(modules: list[nn.Module]) -> None:
    """Store these frozen layers' float32 weights and biases in bf16.

    Under bf16 autocast they are rounded to bf16 on every pass anyway (autocast caches casts of
    trainable leaves only), so the passes compute the same numbers, without the per-pass cast
    (3% of a perf-workload iteration on the CPU), and the frozen weights take half the memory.
    """
    for t in [t for m in modules for t in (m.weight, m.bias)]:
        if t is not None and t.dtype == torch.float32:
            t.data = t.data.to(torch.bfloat16)


def trim_left_padding(ids: torch.Tensor, mask: torch.Tensor, keep: int = 1):
    """Drop the leading columns that are padding in every row, keeping at least `keep` columns.

    Outputs at the remaining columns do not change: positions come from the mask, and masked
    keys get zero attention weight, so all-padding columns are pure wasted compute.
    """
    L = mask.shape[1]
    real = mask.bool().any(0)
    first = int(real.int().argmax()) if bool(real.any()) else L
    first = min(first, max(L - keep, 0))
    return (ids[:, first:], mask[:, first:]) if first else (ids, mask)


def _atomic_dir(path: str):
    """Make a sibling temp dir; returns (tmp, commit) where commit() moves it over `path`."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)

    def commit():
        old = None
        if os.path.exists(path):
            old = tempfile.mkdtemp(prefix=".old-", dir=parent)
            os.replace(path, os.path.join(old, "x"))
        os.replace(tmp, path)
        if old:
            shutil.rmtree(old, ignore_errors=True)

    return tmp, commit


def _check_4bit(lora) -> None:
    """Fail early (before any weight is loaded) when 4-bit loading cannot work here."""
    if lora is None:
        raise ValueError("load_in_4bit=True needs LoRA (pass lora=LoraSettings(...)).")
    if not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
        raise RuntimeError("load_in_4bit=True needs a CUDA GPU and bitsandbytes "
                           "(`pip install cory[gpu]`); use full precision on this machine.")


def _load_lm(name_or_path, load_in_4bit, device, dtype, hf_kwargs):
    """AutoModelForCausalLM.from_pretrained with the right dtype / quantization arguments."""
    import transformers
    from transformers import AutoModelForCausalLM

    kw = dict(hf_kwargs)
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    if load_in_4bit:
        from transformers import BitsAndBytesConfig

        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
        kw["device_map"] = {"": device if device is not None else torch.cuda.current_device()}
        kw[dtype_key] = dtype or torch.bfloat16
    elif dtype is not None:
        kw[dtype_key] = dtype
    lm = AutoModelForCausalLM.from_pretrained(name_or_path, **kw)
    if device is not None and not load_in_4bit:
        lm.to(device)
    return lm


def _lora_config(lora: LoraSettings):
    """peft LoraConfig for a causal LM from our settings."""
    from peft import LoraConfig

    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=lora.target_modules, bias="none", task_type="CAUSAL_LM")


# ----------------------------------------------------------------------------- policy

class LLMPolicy(nn.Module):
    """Causal LM + value head, with KV-cache sampling, batched re-evaluation and a reference."""

    # If set, the prompt pass runs in column chunks of about this many tokens, filling the KV
    # cache as decoding would, so a (B, P) prompt pass's activations are not all alive at once.
    # The Trainer sets it to ppo.max_tokens_per_pass. Off by default: on CPU, smaller
    # temporaries leave glibc's malloc mmapping (and page-faulting) the update's larger ones.
    prefill_chunk_tokens: int | None = None
    # If True, passes with grad (the PPO updates) run the backbone through torch.compile, with
    # dynamic shapes: compiled on first use, once per LoRA adapter (perf workload, CPU: 85 s for
    # both on a fresh inductor cache, 27 s from a filled one), then 12-17% faster bf16 passes.
    # The Trainer sets it from TrainConfig.torch_compile.
    compile_training: bool = False
    _bf16_frozen = False  # set once the frozen matmul weights are stored in bf16 (see amp_dtype)

    def __init__(self, model: nn.Module, *, reference: nn.Module | str | None = None,
                 adapter_name: str | None = None, pad_token_id: int | None = None,
                 mixed_precision: str | None = "auto"):
        super().__init__()
        self.model = model  # an HF causal LM, or a peft PeftModel wrapping one
        self.adapter_name = adapter_name if self.is_lora else None
        if isinstance(reference, nn.Module):
            reference.eval().requires_grad_(False)
            self.ref_model = reference
            self.reference_mode = "copy"
        else:
            if reference == "adapter" and not self.is_lora:
                raise ValueError("reference='adapter' needs a LoRA policy")
            self.ref_model = None
            self.reference_mode = reference  # "adapter" or None
        hf = self.hf_model
        cfg = hf.config
        emb = hf.get_output_embeddings().weight
        self.value_head = nn.Linear(emb.shape[1], 1, device=emb.device, dtype=torch.float32)
        nn.init.normal_(self.value_head.weight, std=1e-2)
        nn.init.zeros_(self.value_head.bias)
        if pad_token_id is None:
            pad_token_id = cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id
        if isinstance(pad_token_id, (list, tuple)):
            pad_token_id = pad_token_id[0]
        self.vocab_size = emb.shape[0]
        ok = pad_token_id is not None and 0 <= pad_token_id < self.vocab_size
        self.pad_token_id = int(pad_token_id) if ok else 0  # any id works: it is always masked
        self._cache_key = _cache_kwarg(hf.base_model)
        self.refresh_trainable_parameters()
        self.mixed_precision = mixed_precision

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, lora: LoraSettings | None = None,
                        load_in_4bit: bool = False, reference: str | None = "auto",
                        device=None, dtype=None, adapter_name: str = "default",
                        disable_dropout: bool = True, pad_token_id: int | None = None,
                        fuse_gelu: bool = True, mixed_precision: str | None = "auto",
                        **hf_kwargs) -> LLMPolicy:
        """Load a causal LM (optionally 4-bit + LoRA) and wrap it with a value head + reference.

        `fuse_gelu` runs GPT-2's tanh-GELU as one fused op (same function, faster).
        `mixed_precision`: "auto" = bf16 autocast on a CUDA GPU that supports it, fp32
        elsewhere; "bf16" = bf16 autocast on any device; None = never.
        """
        if reference == "auto":
            reference = "adapter" if lora is not None else "copy"
        if reference not in ("copy", "adapter", None):
            raise ValueError(f"reference must be 'auto', 'copy', 'adapter' or None: {reference}")
        if reference == "adapter" and lora is None:
            raise ValueError("reference='adapter' needs LoRA")
        if load_in_4bit:
            _check_4bit(lora)
        lm = _load_lm(name_or_path, load_in_4bit, device, dtype, hf_kwargs)
        if disable_dropout:
            _disable_dropout(lm)
        if fuse_gelu:
            _fuse_gelu(lm)
        ref = copy.deepcopy(lm) if reference == "copy" else reference
        if lora is not None:
            from peft import get_peft_model

            lm.requires_grad_(False)
            lm = get_peft_model(lm, _lora_config(lora), adapter_name=adapter_name)
            if disable_dropout:
                _disable_dropout(lm)
        return cls(lm, reference=ref, adapter_name=adapter_name, pad_token_id=pad_token_id,
                   mixed_precision=mixed_precision)

    @classmethod
    def shared_lora_pair(cls, name_or_path: str, lora: LoraSettings,
                         names: tuple[str, str] = ("llm_0", "llm_1"), **kw
                         ) -> tuple[LLMPolicy, LLMPolicy]:
        """Two policies on ONE frozen base with two LoRA adapters; reference = adapters disabled."""
        if kw.pop("reference", "adapter") not in ("adapter", "auto"):
            raise ValueError("a shared LoRA pair's reference is always the adapter-off base")
        first = cls.from_pretrained(name_or_path, lora=lora, reference="adapter",
                                    adapter_name=names[0], **kw)
        peft_model = first.model
        peft_model.add_adapter(names[1], _lora_config(lora))
        if kw.get("disable_dropout", True):
            _disable_dropout(peft_model)
        peft_model.set_adapter(names[0])
        second = cls(peft_model, reference="adapter", adapter_name=names[1],
                     pad_token_id=first.pad_token_id, mixed_precision=first.mixed_precision)
        first._all_lora = second._all_lora  # both adapters' params, restored after set_adapter
        first._restore_grad()
        return first, second

    # -- small accessors ----------------------------------------------------------------------

    @property
    def is_lora(self) -> bool:
        """True when the LM is a peft model (LoRA adapters)."""
        return hasattr(self.model, "peft_config")

    @property
    def hf_model(self) -> nn.Module:
        """The underlying transformers model (with LoRA layers injected, if any)."""
        return self.model.get_base_model() if self.is_lora else self.model

    @property
    def device(self) -> torch.device:
        """Device of the output embedding."""
        return self.hf_model.get_output_embeddings().weight.device

    @property
    def is_quantized(self) -> bool:
        """True for a bitsandbytes-quantized base (decode log-probs then differ from evaluate)."""
        return getattr(self.hf_model.config, "quantization_config", None) is not None

    @property
    def mixed_precision(self) -> str | None:
        """"auto", "bf16" or None: see `from_pretrained`."""
        return self._mixed_precision

    @mixed_precision.setter
    def mixed_precision(self, value: str | None) -> None:
        check_mixed_precision(value)
        if self._bf16_frozen and value is None:
            raise ValueError("mixed_precision=None: this policy's frozen weights are stored in "
                             "bf16 (it ran under bf16 autocast); load it again for float32 passes")
        self._mixed_precision = value
        if self.amp_dtype == torch.bfloat16 and not self._bf16_frozen:
            frozen = self._frozen_matmuls()
            _store_in_bf16(frozen)
            self._bf16_frozen = bool(frozen)

    def _frozen_matmuls(self) -> list[nn.Module]:
        """The frozen Linear / Conv1D layers: the LoRA base's and the reference copy's.

        Not LoRA layers, 4-bit ones, or an LM head tied to the (float32) input embeddings.
        """
        from transformers.pytorch_utils import Conv1D

        roots = [self.hf_model] if self.is_lora and not self.is_quantized else []
        roots += [self.ref_model] if self.ref_model is not None else []
        found = []
        for root in roots:
            tied = root.get_input_embeddings().weight
            found += [m for name, m in root.named_modules()
                      if isinstance(m, (nn.Linear, Conv1D)) and "lora_" not in name
                      and m.weight is not tied and not m.weight.requires_grad]
        return found

    @contextmanager
    def _attention(self, hf: nn.Module, device: torch.device, cache=None):
        """The attention kernels of one pass of `hf`.

        CUDA: any SDPA kernel but cuDNN's (see `_SDPA_KERNELS`). CPU, bf16, with grad: eager
        attention, because the CPU SDPA kernel's bf16 backward is about 3x slower than its fp32
        one; on the perf workload this makes a bf16 LoRA training pass 1.3x faster. CPU, bf16,
        with a float32 KV cache (`_kv_cache_dtype`): SDPA with the query cast to float32.
        """
        if device.type == "cuda":
            with sdpa_kernel(_SDPA_KERNELS):
                yield
            return
        loaded, swap = hf.config._attn_implementation, None
        if loaded == "sdpa" and torch.is_grad_enabled() and self.amp_dtype == torch.bfloat16:
            swap = "eager"
        elif loaded == "sdpa" and getattr(cache, "kv_dtype", None) is not None:
            swap = QUERY_TO_KV_SDPA
        if swap:
            _set_attention(hf, swap)
        try:
            yield
        finally:
            if swap:
                _set_attention(hf, loaded)

    def _kv_cache_dtype(self) -> torch.dtype | None:
        """float32 for rollouts under CPU bf16 autocast with SDPA, else None (the model's dtype).

        The CPU SDPA kernel is about 4x slower for a one-token bf16 query than in float32, so the
        cache keeps the (bf16-valued) keys and values in float32 and the query is cast up.
        """
        cpu_bf16 = self.device.type == "cpu" and self.amp_dtype == torch.bfloat16
        return torch.float32 if cpu_bf16 and self.hf_model.config._attn_implementation == "sdpa" \
            else None

    @property
    def amp_dtype(self) -> torch.dtype | None:
        """The autocast dtype of every pass (see `mixed_precision`), or None for none.

        Once the frozen weights are stored in bf16, "auto" stays bf16 on any device.
        """
        if self.mixed_precision == "bf16":
            return torch.bfloat16
        if self.mixed_precision == "auto" and (self._bf16_frozen or self.device.type == "cuda"
                                               and torch.cuda.is_bf16_supported()):
            return torch.bfloat16
        return None

    def autocast(self):
        """The mixed-precision context of this policy's passes (a no-op without one)."""
        dtype = self.amp_dtype
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    @property
    def needs_recompute(self) -> bool:
        """True when decode-time log-probs differ from `evaluate` (4-bit or mixed precision)."""
        return self.is_quantized or self.amp_dtype is not None

    @property
    def has_reference(self) -> bool:
        """Whether a reference model is available for the KL."""
        return self.reference_mode is not None

    def refresh_trainable_parameters(self) -> None:
        """(Re)collect the parameter lists, e.g. after FSDP replaced the parameter objects."""
        # Plain (unregistered) lists: every LoRA param of the shared model, and our own trainables.
        named = list(self.model.named_parameters())
        self._all_lora = [p for n, p in named if "lora_" in n]
        if self.is_lora:
            mine = [p for n, p in named if "lora_" in n and f".{self.adapter_name}." in n]
        else:
            mine = [p for _, p in named if p.requires_grad]
        self._trainable = mine + list(self.value_head.parameters())

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters the optimizer should update (own adapter or full LM, plus value head)."""
        return list(self._trainable)

    def train(self, mode: bool = True):
        """Switch train/eval mode; the frozen reference copy always stays in eval mode."""
        super().train(mode)
        if self.ref_model is not None:
            self.ref_model.eval()
        return self

    def _restore_grad(self) -> None:
        """peft's set_adapter / disable_adapter freeze other adapters; make all LoRA trainable."""
        for p in self._all_lora:
            p.requires_grad_(True)

    def _activate(self) -> None:
        """Make this policy's adapter the active one on a (possibly shared) peft model."""
        if self.is_lora and self.model.active_adapter != self.adapter_name:
            self.model.set_adapter(self.adapter_name)
            self._restore_grad()

    # -- core passes --------------------------------------------------------------------------

    def _hidden(self, hf: nn.Module, ids, mask, cache=None, position_ids=None, use_cache=False):
        """Backbone pass -> (last hidden states (B, L, H), cache or None)."""
        if position_ids is None:
            position_ids = position_ids_from_mask(mask)[:, -ids.shape[1]:]
        kw = {self._cache_key: cache} if cache is not None else {}
        body = hf.base_model
        if self.compile_training and torch.is_grad_enabled():
            body = self._compiled(body)
            # Fresh tensors: dynamo guards on whether an input is a view (a trimmed batch is)
            # and on its base's strides, and would compile another graph for each kind.
            ids, mask, position_ids = ids.clone(), mask.clone(), position_ids.clone()
        with self.autocast(), self._attention(hf, ids.device, cache):
            out = body(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                       use_cache=use_cache, **kw)
        new_cache = getattr(out, self._cache_key, None) if use_cache else None
        return out.last_hidden_state, new_cache

    def _compiled(self, body: nn.Module) -> nn.Module:
        """`body` under torch.compile with dynamic shapes, wrapped once per policy and module."""
        compiled = self.__dict__.setdefault("_compiled_bodies", {})
        if id(body) not in compiled:
            compiled[id(body)] = torch.compile(body, dynamic=True)
        return compiled[id(body)]

    def _heads(self, h: torch.Tensor):
        """Logits (float32) and values (the value head always runs in float32)."""
        h = h.contiguous()  # a sliced h made the frozen LM head's backward a batched matmul
        with self.autocast():
            logits = self.hf_model.get_output_embeddings()(h).float()
        return logits, self.value_head(h.float()).squeeze(-1)

    def forward(self, input_ids, attention_mask, past_key_values=None, position_ids=None):
        """Full pass -> (logits (B, L, V) float32, values (B, L), cache or None).

        With a cache (e.g. a fresh `transformers.DynamicCache()`), `attention_mask` covers the
        cached tokens plus `input_ids`, and the cache is updated in place and returned.
        """
        self._activate()
        use_cache = past_key_values is not None
        h, cache = self._hidden(self.hf_model, input_ids, attention_mask, past_key_values,
                                position_ids, use_cache=use_cache)
        logits, values = self._heads(h)
        return logits, values, cache

    # -- rollout ------------------------------------------------------------------------------

    def begin(self, prompt_ids, prompt_mask, sampling: SamplingConfig | None = None,
              max_new_tokens: int | None = None) -> DecodeState:
        """Run the left-padded (B, P) prompt once; keep the KV cache and next-token logits.

        `max_new_tokens`, when known, sizes the KV cache exactly (no spare room to grow into).
        """
        sampling = sampling or SamplingConfig()
        with torch.inference_mode():
            self._activate()
            prompt_ids, prompt_mask = trim_left_padding(prompt_ids, prompt_mask)
            B, P = prompt_ids.shape
            cache = growing_cache(P + max_new_tokens if max_new_tokens else 0,
                                  dtype=self._kv_cache_dtype())
            width = max(1, (self.prefill_chunk_tokens or B * P) // B)  # columns per chunk
            for start in range(0, P, width):  # the cache fills chunk by chunk: same keys/values
                end = min(P, start + width)
                h, cache = self._hidden(self.hf_model, prompt_ids[:, start:end],
                                        prompt_mask[:, :end], cache, use_cache=True)
            logits, value = self._heads(h[:, -1])
            seen = None
            if sampling.repetition_penalty != 1.0:
                seen = first_seen(prompt_ids, prompt_mask, 0, self.vocab_size) <= 0
        return DecodeState(cache, prompt_mask.long(), logits, value, seen, sampling)

    @torch.no_grad()
    def sample(self, state: DecodeState, generator: torch.Generator | None = None) -> Step:
        """Draw one token per row from the state's logits (no forward pass).

        `generator` must live on the model's device. Returned tensors are ordinary (not
        inference-mode) tensors, so they can be stored and used in PPO losses.
        """
        raw = F.log_softmax(state.logits, dim=-1)
        if state.sampling.is_identity:
            logp = raw
        else:
            logp = F.log_softmax(transform_logits(state.logits, state.seen, state.sampling), -1)
        token = sample_from_logprobs(logp, generator)[:, None]
        return Step(token=token.squeeze(-1), logprob=logp.gather(-1, token).squeeze(-1),
                    raw_logprob=raw.gather(-1, token).squeeze(-1),
                    value=state.value.clone(), logsoftmax=raw)

    def feed(self, state: DecodeState, token: torch.Tensor, active: torch.Tensor | None = None):
        """Append one token per row (inactive rows: pad, mask 0) and run one cached step."""
        with torch.inference_mode():
            self._activate()
            if active is None:
                active = torch.ones_like(token, dtype=torch.bool)
            active = active.bool()
            token = torch.where(active, token, self.pad_token_id)
            state.mask = torch.cat([state.mask, active.long()[:, None]], dim=1)
            pos = (state.mask.sum(-1, keepdim=True) - 1).clamp(min=0)
            h, state.cache = self._hidden(self.hf_model, token[:, None], state.mask,
                                          cache=state.cache, position_ids=pos, use_cache=True)
            state.logits, state.value = self._heads(h[:, -1])
            if state.seen is not None:
                col = token[:, None]
                state.seen.scatter_(1, col, state.seen.gather(1, col) | active[:, None])
        return state

    # -- training -----------------------------------------------------------------------------

    def evaluate(self, input_ids, attention_mask, n_response: int,
                 sampling: SamplingConfig | None = None,
                 return_logsoftmax: bool = False) -> Evaluation:
        """Recompute (with grad) log-probs, raw log-probs, values and entropy of the last T tokens.

        Outputs at masked response positions are 0 (their tokens are padding); mask them out.
        """
        self._activate()
        T = n_response
        input_ids, attention_mask = trim_left_padding(input_ids, attention_mask, T + 1)
        h, _ = self._hidden(self.hf_model, input_ids, attention_mask)
        logits, values = self._heads(h[:, -T - 1:-1])  # position t-1 predicts response token t
        raw = F.log_softmax(logits, dim=-1)
        tokens = input_ids[:, -T:, None]
        real = attention_mask[:, -T:].bool()
        raw_lp = raw.gather(-1, tokens).squeeze(-1)
        if sampling is None or sampling.is_identity:
            logp = raw_lp
        else:
            seen = None
            if sampling.repetition_penalty != 1.0:
                first = first_seen(input_ids, attention_mask, T, self.vocab_size)
                steps = torch.arange(T, device=first.device)[None, :, None]
                seen = first[:, None, :] <= steps
            logp = F.log_softmax(transform_logits(logits, seen, sampling), -1)
            logp = logp.gather(-1, tokens).squeeze(-1)
        entropy = -(raw.exp() * raw).sum(-1)
        zero = torch.zeros((), device=raw.device)
        return Evaluation(logprobs=torch.where(real, logp, zero),
                          raw_logprobs=torch.where(real, raw_lp, zero),
                          values=values, entropy=entropy,
                          logsoftmax=raw if return_logsoftmax else None)

    def reference_logsoftmax(self, input_ids, attention_mask, n_response: int,
                             chunk_size: int = 32) -> torch.Tensor:
        """No-grad reference log-softmax (B, T, V) of the last T tokens, chunked over the batch."""
        if not self.has_reference:
            raise RuntimeError("this policy has no reference model (reference=None)")
        T = n_response
        out = []
        ctx = self.model.disable_adapter() if self.reference_mode == "adapter" else nullcontext()
        hf = self.ref_model if self.reference_mode == "copy" else self.hf_model
        try:
            with ctx:
                for i in range(0, input_ids.shape[0], chunk_size):
                    with torch.inference_mode():
                        ids, mask = trim_left_padding(input_ids[i:i + chunk_size],
                                                      attention_mask[i:i + chunk_size], T + 1)
                        h, _ = self._hidden(hf, ids, mask)
                        with self.autocast():
                            logits = hf.get_output_embeddings()(h[:, -T - 1:-1]).float()
                    with torch.no_grad():  # outside inference mode: a normal tensor for losses
                        out.append(F.log_softmax(logits, dim=-1))
        finally:
            self._restore_grad()
        return torch.cat(out, dim=0)

    # -- persistence --------------------------------------------------------------------------

    def save(self, path: str) -> None:
        """Atomically write LM weights (or just the adapter) and the value head as safetensors."""
        tmp, commit = _atomic_dir(path)
        try:
            self._write(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        commit()

    def _write(self, tmp: str) -> None:
        """Write the checkpoint files into the folder tmp."""
        from safetensors.torch import save_file, save_model

        meta = {"kind": "lora" if self.is_lora else "full", "adapter_name": self.adapter_name}
        if self.is_lora:
            from peft import get_peft_model_state_dict

            sd = get_peft_model_state_dict(self.model, adapter_name=self.adapter_name)
            save_file({k: v.detach().contiguous() for k, v in sd.items()},
                      os.path.join(tmp, "adapter.safetensors"))
            cfg = self.model.peft_config[self.adapter_name]
            tm = cfg.target_modules
            meta["lora"] = {"r": cfg.r, "alpha": cfg.lora_alpha,
                            "target_modules": tm if isinstance(tm, str) else sorted(tm)}
        else:
            save_model(self.model, os.path.join(tmp, "model.safetensors"))
        save_file({k: v.detach().contiguous() for k, v in self.value_head.state_dict().items()},
                  os.path.join(tmp, "value_head.safetensors"))
        with open(os.path.join(tmp, "policy.json"), "w") as f:
            json.dump(meta, f)

    def load(self, path: str) -> LLMPolicy:
        """Load weights written by `save` into this policy in place (optimizer refs stay valid)."""
        from safetensors.torch import load_file, load_model

        with open(os.path.join(path, "policy.json")) as f:
            kind = json.load(f)["kind"]
        if kind != ("lora" if self.is_lora else "full"):
            raise ValueError(f"{path} holds a {kind} checkpoint, this policy is not")
        if self.is_lora:
            from peft import set_peft_model_state_dict

            sd = load_file(os.path.join(path, "adapter.safetensors"), device=str(self.device))
            res = set_peft_model_state_dict(self.model, sd, adapter_name=self.adapter_name)
            mine = f".{self.adapter_name}."
            bad = [k for k in res.unexpected_keys if "lora_" in k]
            bad += [k for k in res.missing_keys if "lora_" in k and mine in k]
            if bad:
                raise ValueError(f"adapter checkpoint does not match this model: {bad[:3]}")
            self._restore_grad()
        else:
            load_model(self.model, os.path.join(path, "model.safetensors"),
                       device=str(self.device))
        vh = load_file(os.path.join(path, "value_head.safetensors"), device=str(self.device))
        self.value_head.load_state_dict(vh)
        return self
