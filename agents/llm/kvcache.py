"""A KV cache that appends in place, for token-by-token decoding with Hugging Face models.

``transformers.DynamicCache`` grows each layer with ``torch.cat`` on every decode step, so
decoding T tokens after a P-token prompt copies the whole cache T times. ``growing_cache()``
keeps each layer in a buffer with spare room (doubled when full) and hands the model a view of
the filled part, so a step writes only the new keys and values. A caller that knows the final
length (prompt + new tokens) passes it as ``reserve``: the buffer is made that size at once.

Attention reads the same numbers either way, so decoding with either cache gives identical
outputs. Needs transformers >= 4.56 (cache layers); with older versions ``growing_cache()``
returns None and the model makes its own cache.

``growing_cache(dtype=torch.float32)`` stores the keys and values in float32 while the model
computes in bf16 (CPU autocast); the model must then attend with ``QUERY_TO_KV_SDPA``, which
casts the query to the cache's dtype (the CPU SDPA kernel is slow on a one-token bf16 query;
docs/performance.md has the figures). The cached values are the same bf16 numbers either way.
"""

from __future__ import annotations

import torch

try:
    from transformers.cache_utils import Cache, DynamicLayer
except ImportError:  # transformers < 4.56: no per-layer cache classes
    Cache = DynamicLayer = None

QUERY_TO_KV_SDPA = "sdpa_query_to_kv_dtype"  # an attention implementation name (see below)


if DynamicLayer is not None:

    class GrowingLayer(DynamicLayer):
        """A DynamicLayer whose keys/values are views of a buffer with spare capacity."""

        reserve = 0  # positions to allocate at the first update (0: grow by doubling)
        store_dtype = None  # the dtype the keys/values are stored in (None: the states' own)

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            """Write the new states after the cached ones; return (keys, values) so far."""
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self.buffers = None
            n, k = self.get_seq_length(), key_states.shape[-2]
            if not self._fits(key_states, n, k):
                room = self.reserve if self.reserve >= n + k else max(2 * (n + k), n + k + 64)
                self.buffers = [s.new_empty((*s.shape[:2], room, s.shape[-1]),
                                            dtype=self.store_dtype or s.dtype)
                                for s in (key_states, value_states)]
                if n:  # after crop / batch_select / repeat_interleave the states are copied once
                    self.buffers[0][:, :, :n] = self.keys
                    self.buffers[1][:, :, :n] = self.values
            keys, values = self.buffers
            keys[:, :, n:n + k] = key_states
            values[:, :, n:n + k] = value_states
            self.keys, self.values = keys[:, :, :n + k], values[:, :, :n + k]
            return self.keys, self.values

        def _fits(self, states: torch.Tensor, n: int, k: int) -> bool:
            """Whether the cached states still live at the start of a buffer with room for k."""
            buf = self.buffers[0] if self.buffers else None
            return (buf is not None and n > 0 and self.keys.data_ptr() == buf.data_ptr()
                    and buf.shape[:2] == states.shape[:2]
                    and buf.dtype == (self.store_dtype or states.dtype)
                    and n + k <= buf.shape[2])

    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def query_to_kv_sdpa(module, query, key, value, attention_mask, **kwargs):
        """Transformers' SDPA attention with the query cast to the keys' dtype, output cast back."""
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.to(key.dtype)
        with torch.autocast(query.device.type, enabled=False):  # CPU autocast would cast back
            out, weights = sdpa_attention_forward(module, query.to(key.dtype), key, value,
                                                  attention_mask, **kwargs)
        return out.to(query.dtype), weights

    AttentionInterface.register(QUERY_TO_KV_SDPA, query_to_kv_sdpa)
    AttentionMaskInterface.register(QUERY_TO_KV_SDPA, sdpa_mask)


def growing_cache(reserve: int = 0, dtype: torch.dtype | None = None):
    """A fresh in-place-appending KV cache, or None where transformers lacks cache layers.

    `reserve`: the number of positions the cache will hold in the end, if known.
    `dtype`: store keys/values in this dtype (None: the model's); the model must then attend with
    `QUERY_TO_KV_SDPA`. The cache's `kv_dtype` attribute says which.
    """
    if DynamicLayer is None:
        return None

    def new_layer():
        layer = GrowingLayer()
        layer.reserve, layer.store_dtype = reserve, dtype
        return layer

    cache = Cache(layer_class_to_replicate=new_layer)
    cache.kv_dtype = dtype
    return cache
