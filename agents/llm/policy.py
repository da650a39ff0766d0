"""LLM policy for token-level PPO: a Hugging Face causal LM plus a scalar value head.

Sequence layout (shared with the environment): a batch is (B, L) `input_ids` + `attention_mask`;
the prompt is left-padded and fills columns 0..P-1, the response fills P..P+T-1 (positions after
EOS are masked 0). Position ids always come from the mask (cumsum - 1, clamped at 0), so left
padding never shifts positions.

Rollout (under `torch.inference_mode()`, one forward of length 1 per new token, and a KV cache
that appends in place, `agents.llm.kvcache.growing_cache`); `agents.llm.rollout.play_turn` is
the loop:

    state = policy.begin(prompt_ids, prompt_mask, sampling)
    for t in range(T):
        step = policy.sample(state, generator)     # token, logprob, raw_logprob, value, logsoftmax
        policy.feed(state, step.token, active)     # active: rows still generating this token
    ref = policy.reference_logits(ids, mask, T)    # ONE batched reference pass per turn

The exact KL to the reference comes from that single pass after the turn
(`agents.llm.logits.kl_to_reference`): one big forward instead of T streamed single-token
reference steps, and no second KV cache.

Training: `evaluate(ids, mask, T, sampling)` recomputes, with grad, the same log-probs (under the
same sampling transform, `agents.llm.sampling`), the raw log-probs, values and entropies. The value
for token t is read from the hidden state that predicts token t, both here and in `sample`.

With a 4-bit (bitsandbytes) base the single-token cached step and the full pass run different
kernels, so decode-time log-probs differ from `evaluate`; bf16 autocast differs by rounding.
When `policy.needs_recompute`, the rollout takes the turn's log-probs, values and KL from a
no-grad `evaluate` pass shaped like the reference pass (`agents.llm.rollout.full_pass`).

How the passes are made fast without changing what they compute (bf16 storage of frozen
weights, attention kernels, compile, KV-cache dtype) is `agents/llm/speed.py`. Dropout is switched
off by default (`disable_dropout=True`) so the PPO ratio is exactly 1 before the first update;
that also zeroes LoRA dropout.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cory_common.files import atomic_dir

from . import loading, speed
from .decoding import Decoding
from .loading import LoraSettings, cache_kwarg, check_4bit, load_lm, lora_config
from .logits import fused_head, head_operands, head_output, token_logprobs
from .sampling import SamplingConfig, first_seen, transform_logits
from .speed import check_mixed_precision, trim_left_padding

__all__ = ["Evaluation", "LLMPolicy"]


@dataclass
class Evaluation:
    """Per-response-token outputs of a full (B, L) pass; all (B, T) except logsoftmax."""

    logprobs: torch.Tensor
    raw_logprobs: torch.Tensor
    values: torch.Tensor
    entropy: torch.Tensor  # of the raw (untransformed) policy
    logsoftmax: torch.Tensor | None = None  # (B, T, V) raw, when asked for
    logits: torch.Tensor | None = None  # (B, T, V) raw, the head's dtype, when asked for


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding: cumsum(mask) - 1, clamped at 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


class LLMPolicy(Decoding, nn.Module):
    """Causal LM + value head, with KV-cache sampling, batched re-evaluation and a reference."""

    # If set, the prompt pass runs in column chunks of about this many tokens, filling the KV
    # cache as decoding would (the Trainer sets it to ppo.max_tokens_per_pass).
    prefill_chunk_tokens: int | None = None
    # If True, passes with grad run the backbone through torch.compile (dynamic shapes,
    # compiled on first use, once per LoRA adapter); the Trainer sets it from torch_compile.
    compile_training: bool = False
    reference_adapter: str | None = None  # a frozen adapter that is the reference (shared_lora)
    _bf16_frozen = False  # set once the frozen matmul weights are stored in bf16 (see amp_dtype)

    def __init__(self, model: nn.Module, *, reference: nn.Module | str | None = None,
                 adapter_name: str | None = None, pad_token_id: int | None = None,
                 mixed_precision: str | None = "auto"):
        super().__init__()
        self._head_cache: dict = {}  # bf16 copies of frozen float32 LM heads (logits.py)
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
        self._cache_key = cache_kwarg(hf.base_model)
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
            check_4bit(lora)
        lm = load_lm(name_or_path, load_in_4bit, device, dtype, hf_kwargs)
        if disable_dropout:
            loading.disable_dropout(lm)
        if fuse_gelu:
            speed.fuse_gelu(lm)
        ref = copy.deepcopy(lm) if reference == "copy" else reference
        if lora is not None:
            from peft import get_peft_model

            lm.requires_grad_(False)
            lm = get_peft_model(lm, lora_config(lora), adapter_name=adapter_name)
            if disable_dropout:
                loading.disable_dropout(lm)
        return cls(lm, reference=ref, adapter_name=adapter_name, pad_token_id=pad_token_id,
                   mixed_precision=mixed_precision)

    @classmethod
    def shared_lora(cls, name_or_path: str, lora: LoraSettings | None,
                    names: Sequence[str] = ("llm_0", "llm_1"),
                    adapters: dict[str, str] | None = None, **kw) -> tuple[LLMPolicy, ...]:
        """K policies on ONE frozen base, a LoRA adapter each: fresh from `lora`, or the PEFT
        adapter folder `adapters[name]`. The reference is the base with adapters off; for a
        loaded adapter it is a frozen copy of it (each agent's own initial model)."""
        if kw.pop("reference", "adapter") not in ("adapter", "auto"):
            raise ValueError("a shared LoRA base's reference is always its initial adapters")
        loaded = {n: loading.read_adapter(p) for n, p in (adapters or {}).items()}
        configs = {n: loaded[n][0] if n in loaded else lora_config(lora) for n in names}
        first = cls.from_pretrained(name_or_path, lora=configs[names[0]], reference="adapter",
                                    adapter_name=names[0], **kw)
        peft_model = first.model
        for n in names[1:]:
            peft_model.add_adapter(n, configs[n])
        if loaded:
            from peft import set_peft_model_state_dict
        for n, (config, weights) in loaded.items():
            peft_model.add_adapter(f"ref_{n}", config)
            for name in (n, f"ref_{n}"):
                set_peft_model_state_dict(peft_model, weights, adapter_name=name)
        if kw.get("disable_dropout", True):
            loading.disable_dropout(peft_model)
        peft_model.set_adapter(names[0])
        policies = [first] + [cls(peft_model, reference="adapter", adapter_name=n,
                                  pad_token_id=first.pad_token_id,
                                  mixed_precision=first.mixed_precision) for n in names[1:]]
        for p in policies:
            p._all_lora = policies[-1]._all_lora  # every adapter's params, kept trainable
            p.reference_adapter = f"ref_{p.adapter_name}" if p.adapter_name in loaded else None
        first._restore_grad()
        return tuple(policies)

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
            frozen = speed.frozen_matmuls(self)
            speed.store_in_bf16(frozen)
            self._bf16_frozen = bool(frozen)

    @property
    def amp_dtype(self) -> torch.dtype | None:
        """The autocast dtype of every pass (see `mixed_precision`), or None for none."""
        return speed.amp_dtype(self.mixed_precision, self._bf16_frozen, self.device)

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
        self._all_lora = [p for n, p in named if "lora_" in n and ".ref_" not in n]
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

    @contextmanager
    def _adapter(self, name: str):
        """Run with another adapter of the shared peft model active (this policy's after)."""
        self.model.set_adapter(name)
        try:
            yield
        finally:
            self.model.set_adapter(self.adapter_name)

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
            body = speed.compiled(self, body)
            # Fresh tensors: dynamo guards on whether an input is a view (a trimmed batch is)
            # and on its base's strides, and would compile another graph for each kind.
            ids, mask, position_ids = ids.clone(), mask.clone(), position_ids.clone()
        with self.autocast(), speed.attention(self, hf, ids.device, cache):
            out = body(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                       use_cache=use_cache, **kw)
        new_cache = getattr(out, self._cache_key, None) if use_cache else None
        return out.last_hidden_state, new_cache

    def _heads(self, h: torch.Tensor):
        """Logits (float32) and values (the value head always runs in float32)."""
        h = h.contiguous()  # a sliced h made the frozen LM head's backward a batched matmul
        return self._logits(self.hf_model, h), self.value_head(h.float()).squeeze(-1)

    def _logits(self, hf: nn.Module, h: torch.Tensor) -> torch.Tensor:
        """`hf`'s LM head on h, float32 (soft-capped where the model's config says so)."""
        return self._head_output(hf, h).float()

    def _head_output(self, hf: nn.Module, h: torch.Tensor) -> torch.Tensor:
        """`hf`'s LM head on h in its matmul's dtype (`agents.llm.logits.head_output`)."""
        return head_output(hf, h, self.amp_dtype, self._head_cache)

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

    # -- training -----------------------------------------------------------------------------

    def evaluate(self, input_ids, attention_mask, n_response: int,
                 sampling: SamplingConfig | None = None,
                 return_logsoftmax: bool = False, return_logits: bool = False) -> Evaluation:
        """Recompute (with grad) log-probs, raw log-probs, values and entropy of the last T tokens
        (and the raw log-softmax or logits when asked for).

        Outputs at masked response positions are 0 (their tokens are padding); mask them out.
        """
        self._activate()
        T = n_response
        input_ids, attention_mask = trim_left_padding(input_ids, attention_mask, T + 1)
        h, _ = self._hidden(self.hf_model, input_ids, attention_mask)
        tokens = input_ids[:, -T:, None]
        real = attention_mask[:, -T:].bool()
        zero = torch.zeros((), device=h.device)
        plain = sampling is None or sampling.is_identity
        if plain and not return_logsoftmax and fused_head(self.hf_model):
            hs = h[:, -T - 1:-1].contiguous()  # position t-1 predicts response token t
            operands = head_operands(self.hf_model, hs, self.amp_dtype, self._head_cache)
            raw_lp, entropy, z = token_logprobs(*operands, tokens[..., 0], logits=True)
            raw_lp = torch.where(real, raw_lp, zero)
            return Evaluation(logprobs=raw_lp, raw_logprobs=raw_lp, entropy=entropy,
                              values=self.value_head(hs.float()).squeeze(-1),
                              logits=z if return_logits else None)
        logits, values = self._heads(h[:, -T - 1:-1])
        raw = F.log_softmax(logits, dim=-1)
        raw_lp = raw.gather(-1, tokens).squeeze(-1)
        if plain:
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
        return Evaluation(logprobs=torch.where(real, logp, zero),
                          raw_logprobs=torch.where(real, raw_lp, zero),
                          values=values, entropy=entropy,
                          logsoftmax=raw if return_logsoftmax else None,
                          logits=logits if return_logits else None)

    def values(self, input_ids, attention_mask) -> torch.Tensor:
        """Values (B, L) float32 at every position, without the LM head (a critic's pass)."""
        self._activate()
        L = input_ids.shape[1]
        ids, mask = trim_left_padding(input_ids, attention_mask, 1)
        h, _ = self._hidden(self.hf_model, ids, mask)
        v = self.value_head(h.float()).squeeze(-1)  # (B, L') for the trimmed columns
        return F.pad(v, (L - v.shape[1], 0))

    def reference_logsoftmax(self, input_ids, attention_mask, n_response: int,
                             chunk_size: int = 32) -> torch.Tensor:
        """No-grad reference log-softmax (B, T, V) of the last T tokens, chunked over the batch."""
        with torch.no_grad():
            return F.log_softmax(self.reference_logits(input_ids, attention_mask, n_response,
                                                       chunk_size).float(), dim=-1)

    def reference_logits(self, input_ids, attention_mask, n_response: int,
                         chunk_size: int = 32) -> torch.Tensor:
        """No-grad reference logits (B, T, V) of the last T tokens in the head's dtype (bf16
        under bf16 autocast), chunked over the batch."""
        if not self.has_reference:
            raise RuntimeError("this policy has no reference model (reference=None)")
        T = n_response
        out = []
        ctx = nullcontext()
        if self.reference_mode == "adapter":
            ctx = self._adapter(self.reference_adapter) if self.reference_adapter \
                else self.model.disable_adapter()
        hf = self.ref_model if self.reference_mode == "copy" else self.hf_model
        try:
            with ctx:
                for i in range(0, input_ids.shape[0], chunk_size):
                    with torch.inference_mode():
                        ids, mask = trim_left_padding(input_ids[i:i + chunk_size],
                                                      attention_mask[i:i + chunk_size], T + 1)
                        h, _ = self._hidden(hf, ids, mask)
                        # contiguous, as in _heads: the same kernels
                        z = self._head_output(hf, h[:, -T - 1:-1].contiguous())
                    out.append(z.clone())  # outside inference mode: a normal tensor for losses
        finally:
            self._restore_grad()
        return torch.cat(out, dim=0)

    # -- persistence --------------------------------------------------------------------------

    def save(self, path: str) -> None:
        """Atomically write LM weights (or just the adapter) and the value head as safetensors."""
        with atomic_dir(path, replace=True) as tmp:
            loading.write_policy(self, str(tmp))

    def load(self, path: str) -> LLMPolicy:
        """Load weights written by `save` into this policy in place (optimizer refs stay valid)."""
        loading.read_policy(self, path)
        return self
