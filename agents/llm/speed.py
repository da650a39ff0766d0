"""Speed plumbing of the policy's passes: precision, attention kernels, compile, KV-cache dtype.

Everything here changes how fast a pass runs, never what it computes (to rounding where said):

* bf16 autocast (`mixed_precision`: "auto" = on a CUDA GPU that supports it, "bf16" = on any
  device, None = never). Under it the frozen matmul weights (a LoRA base, a reference copy) are
  stored in bf16, since autocast rounds them to bf16 on every pass anyway.
* attention kernels: on CUDA any SDPA kernel but cuDNN's (it returns NaN gradients in bf16 for
  all-padding query rows, which left-padded prompts have); on a CPU under bf16, eager attention
  for passes with grad and SDPA with the query cast up for a float32 KV cache.
* the KV cache of CPU bf16 rollouts keeps keys and values in float32.
* `torch.compile` of the backbone for passes with grad (`compile_training`).
* GPT-2's Python tanh-GELU swapped for the fused kernel (the same formula).
* leading all-padding columns dropped before a pass (exact: positions come from the mask).

docs/performance.md has the measurements behind each choice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .kvcache import QUERY_TO_KV_SDPA

MIXED_PRECISION = ("auto", "bf16", None)
SDPA_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def check_mixed_precision(value) -> None:
    """Raise ValueError naming `value` unless it is one of MIXED_PRECISION."""
    if value not in MIXED_PRECISION:
        raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {value!r}")


def amp_dtype(mixed_precision: str | None, bf16_frozen: bool, device: torch.device):
    """The autocast dtype of a policy's passes, or None; "auto" stays bf16 once weights are."""
    if mixed_precision == "bf16":
        return torch.bfloat16
    if mixed_precision == "auto" and (bf16_frozen or device.type == "cuda"
                                      and torch.cuda.is_bf16_supported()):
        return torch.bfloat16
    return None


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


def set_attention(hf: nn.Module, name: str) -> None:
    """Switch an HF model's attention implementation ("sdpa", "eager", ...).

    Where every sub-model reads the one top-level config (GPT-2, Llama, ...), setting it there
    is enough; `set_attn_implementation` walks every module.
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


@contextmanager
def attention(policy, hf: nn.Module, device: torch.device, cache=None):
    """The attention kernels of one pass of `hf` by `policy` (see the module docstring)."""
    if device.type == "cuda":
        with sdpa_kernel(SDPA_KERNELS):
            yield
        return
    loaded, swap = hf.config._attn_implementation, None
    if loaded == "sdpa" and torch.is_grad_enabled() and policy.amp_dtype == torch.bfloat16:
        swap = "eager"  # the CPU SDPA kernel's bf16 backward is slow
    elif loaded == "sdpa" and getattr(cache, "kv_dtype", None) is not None:
        swap = QUERY_TO_KV_SDPA
    if swap:
        set_attention(hf, swap)
    try:
        yield
    finally:
        if swap:
            set_attention(hf, loaded)


def kv_cache_dtype(policy) -> torch.dtype | None:
    """float32 for rollouts under CPU bf16 autocast with SDPA, else None (the model's dtype)."""
    cpu_bf16 = policy.device.type == "cpu" and policy.amp_dtype == torch.bfloat16
    sdpa = policy.hf_model.config._attn_implementation == "sdpa"
    return torch.float32 if cpu_bf16 and sdpa else None


def compiled(policy, body: nn.Module) -> nn.Module:
    """`body` under torch.compile with dynamic shapes, wrapped once per policy and module."""
    bodies = policy.__dict__.setdefault("_compiled_bodies", {})
    if id(body) not in bodies:
        bodies[id(body)] = torch.compile(body, dynamic=True)
    return bodies[id(body)]


def frozen_matmuls(policy) -> list[nn.Module]:
    """The frozen Linear / Conv1D layers: the LoRA base's and the reference copy's.

    Not LoRA layers, 4-bit ones, or an LM head tied to the (float32) input embeddings.
    """
    from transformers.pytorch_utils import Conv1D

    roots = [policy.hf_model] if policy.is_lora and not policy.is_quantized else []
    roots += [policy.ref_model] if policy.ref_model is not None else []
    found = []
    for root in roots:
        tied = root.get_input_embeddings().weight
        found += [m for name, m in root.named_modules()
                  if isinstance(m, (nn.Linear, Conv1D)) and "lora_" not in name
                  and m.weight is not tied and not m.weight.requires_grad]
    return found


def store_in_bf16(modules: list[nn.Module]) -> None:
    """Store these frozen layers' float32 weights and biases in bf16 (same numbers, autocast)."""
    for t in [t for m in modules for t in (m.weight, m.bias)]:
        if t is not None and t.dtype == torch.float32:
            t.data = t.data.to(torch.bfloat16)


class _TanhGELU(nn.Module):
    """The tanh-approximated GELU of GPT-2 (`gelu_new`) as PyTorch's fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


def fuse_gelu(model: nn.Module) -> None:
    """Swap transformers' Python `NewGELUActivation` for one fused op (same formula, ~2e-7)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child).__name__ == "NewGELUActivation":
                setattr(module, name, _TanhGELU())


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """Run torch ops on `n` intra-op threads inside the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
