"""The fast decode path: a policy's weights folded into plain bf16 matrices and run by one small
functional forward over a static KV cache (Llama and Gemma 3 text models, on a CPU).

Why: a decode step streams every weight once, so its floor is the weights' bytes over the
memory's bandwidth. The exact path (the Hugging Face modules under bf16 autocast, LoRA's
wrappers, a growing cache and a 4-D mask built per step) spends most of a step between
operators. Here each step is 4 matrix products (q, k and v as one; gate and up as one) and a
few element-wise ops per layer:

    x = embed(token)                                   # Gemma: times sqrt(hidden)
    for layer: x = x + attn(norm(x)); x = x + mlp(norm(x))   # Gemma: a norm after each too
    logits = head(norm(x))

The LoRA adapter is folded into its target matrices (W + s·B·A, rounded once to bf16), and
every matrix is copied into oneDNN's packed layout for skinny products; the frozen base itself
is never changed (the other agent on the same base reads it too). Whenever a trained tensor
has changed since the last fold (its `_version` moved: an optimizer step, a load), the next
`begin` folds again; `release` frees the copies during an update, and one engine's copies are
held at a time (a fold releases the others': a chain's agents decode one after another). The
residual stream and the norms stay float32, as under autocast.

Its probabilities are the trainer's up to rounding, not bit for bit. The trainer recomputes
the log-probs it trains on, as it does for every mixed-precision policy; the rollout records
the sampler's log-probs beside them, logs their per-token KL, and PPO weighs each token by the
truncated importance ratio min(pi_trainer / pi_sampler, cap) (`agents.learners.shaping.
truncated_is_weights`, applied in `agents.learners.ppo.policy_loss`).

`DecodeEngine.unsupported(policy)` says in words why a policy must stay on the exact path
(another architecture, a GPU, float32 passes, 4-bit, DoRA). `TrainConfig.decode` chooses:
"exact" (the default), "fast" (refused, saying why, where it cannot run) or "auto".
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F

from .decoding import append_token, mark_seen, prompt_state
from .sampling import DecodeState, SamplingConfig
from .speed import trim_left_padding

DECODE_PATHS = ("auto", "fast", "exact")
ARCHITECTURES = ("llama", "gemma3_text")
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _packed_kernel() -> bool:
    """Whether oneDNN's packed bf16 matrix product runs here (and equals F.linear)."""
    try:
        w, x = torch.randn(8, 16).bfloat16(), torch.randn(2, 16).bfloat16()
        out = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(
            w, 16), None, "none", [], "")
        return torch.equal(out, F.linear(x, w))
    except (RuntimeError, AttributeError):
        return False


PACKED = _packed_kernel()


def pack(w: torch.Tensor) -> torch.Tensor:
    """A bf16 (N, K) weight laid out for the skinny products of decoding (oneDNN's blocked
    layout where it runs, else as it is)."""
    return torch.ops.mkldnn._reorder_linear_weight(w, 16) if PACKED else w.contiguous()


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ W.T in bf16 for a `pack`ed W."""
    if PACKED:
        return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    return F.linear(x, w)


def _config(hf):
    """The text config of a causal LM."""
    cfg = hf.config
    return getattr(cfg, "text_config", None) or cfg


def _activation(cfg) -> str | None:
    """The MLP's activation name (Gemma: hidden_activation; Llama: hidden_act)."""
    return getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", None)


class StaticCache:
    """Keys and values of every layer in (B, Hkv, capacity, D) float32 tensors (a CPU's small
    attention products run faster in float32 than in bf16), filled up to `size`."""

    def __init__(self, layers: int, batch: int, heads: int, capacity: int, dim: int, device):
        shape = (batch, heads, capacity, dim)
        self.k = [torch.empty(shape, device=device) for _ in range(layers)]
        self.v = [torch.empty(shape, device=device) for _ in range(layers)]
        self.size = 0

    def batch_repeat_interleave(self, g: int) -> None:
        """Each row g times (a group's answers share one prompt pass), as transformers' caches
        name it."""
        self.k = [k.repeat_interleave(g, 0) for k in self.k]
        self.v = [v.repeat_interleave(g, 0) for v in self.v]


class DecodeEngine:
    """begin / feed of one policy on folded bf16 weights (see the module docstring); the
    policy's own `sample` draws from the state they leave."""

    resident = None  # a weak reference to the one engine whose packed matrices are held

    @staticmethod
    def unsupported(policy) -> str | None:
        """Why `policy` cannot decode on this path, or None when it can."""
        hf = policy.hf_model
        kind = getattr(_config(hf), "model_type", None)
        if kind not in ARCHITECTURES:
            return f"model type {kind!r} (the fast path runs {', '.join(ARCHITECTURES)})"
        if policy.device.type != "cpu":
            return f"device {policy.device.type} (the fast path is for CPUs)"
        if policy.amp_dtype != torch.bfloat16:
            return "float32 passes (the fast path decodes in bf16: --mixed-precision bf16)"
        if policy.is_quantized:
            return "a 4-bit base"
        if any(getattr(getattr(m, "base_layer", m), "bias", None) is not None
               for layer in hf.base_model.layers for m in layer.self_attn.children()):
            return "attention biases"
        act = _activation(_config(hf))
        if act not in ACTIVATIONS:
            return f"activation {act!r}"
        for module in hf.modules():
            if getattr(module, "use_dora", {}).get(policy.adapter_name):
                return "a DoRA adapter"
        return None

    def __init__(self, policy):
        why = self.unsupported(policy)
        if why:
            raise ValueError(f"the fast decode path cannot run this policy: {why}")
        self.policy = policy
        hf = policy.hf_model
        cfg = _config(hf)
        self.body = hf.base_model
        self.gemma = cfg.model_type == "gemma3_text"
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scale = (cfg.query_pre_attn_scalar if self.gemma else self.head_dim) ** -0.5
        self.act = ACTIVATIONS[_activation(cfg)]
        self.eps = cfg.rms_norm_eps
        types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
        self.windows = [cfg.sliding_window if t == "sliding_attention" else None for t in types]
        self.layer_types = types
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.embed_scale = math.sqrt(cfg.hidden_size) if self.gemma else 1.0
        self.embed = self.body.embed_tokens.weight
        self.layers: list[dict] = []
        self.head = None
        self._versions: list[int] | None = None
        self.folds = 0

    # -- weights ------------------------------------------------------------------------------

    def _trained(self) -> list[torch.Tensor]:
        """The tensors whose change calls for a new fold (this policy's trainables)."""
        return self.policy.trainable_parameters()

    def _weight(self, linear) -> torch.Tensor:
        """The bf16 weight of one Linear with this policy's LoRA adapter folded in."""
        name = self.policy.adapter_name
        base = getattr(linear, "base_layer", linear)
        lora_a = getattr(linear, "lora_A", None)
        if lora_a is not None and name in lora_a:
            delta = linear.lora_B[name].weight.float() @ lora_a[name].weight.float()
            return (base.weight.float() + linear.scaling[name] * delta).to(torch.bfloat16)
        return base.weight.detach().to(torch.bfloat16)

    def fold(self) -> None:
        """Build every layer's packed matrices from the policy's current weights (releasing
        another engine's first: one model's copy is held at a time, as one model decodes)."""
        held = DecodeEngine.resident() if DecodeEngine.resident else None
        if held is not None and held is not self:
            held.release()
        DecodeEngine.resident = weakref.ref(self)
        with torch.no_grad():
            self.layers = []
            for layer in self.body.layers:
                attn, mlp = layer.self_attn, layer.mlp
                w = {n: self._weight(getattr(attn if n[0] in "qkvo" else mlp, n))
                     for n in PROJECTIONS}
                norms = {n: m.weight.detach().float() + (1.0 if self.gemma else 0.0)
                         for n, m in layer.named_children() if n.endswith("layernorm")}
                if self.gemma:
                    norms["q_norm"] = attn.q_norm.weight.detach().float() + 1.0
                    norms["k_norm"] = attn.k_norm.weight.detach().float() + 1.0
                self.layers.append({
                    "qkv": pack(torch.cat([w["q_proj"], w["k_proj"], w["v_proj"]])),
                    "o": pack(w["o_proj"]), "down": pack(w["down_proj"]),
                    "gate_up": pack(torch.cat([w["gate_proj"], w["up_proj"]])), **norms})
            norm = self.body.norm.weight.detach().float()
            self.final_norm = norm + 1.0 if self.gemma else norm
            self.head = pack(self._weight(self.policy.hf_model.get_output_embeddings()))
        self._versions = [p._version for p in self._trained()]
        self.folds += 1

    def refresh(self) -> None:
        """Fold again if the matrices were released or a trained tensor changed since."""
        if self._versions is None or [p._version for p in self._trained()] != self._versions:
            self.fold()

    def release(self) -> None:
        """Free the packed matrices (during an update); the next `begin` folds again."""
        self.layers, self.head, self._versions = [], None, None

    # -- the forward --------------------------------------------------------------------------

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """RMSNorm in float32, torch's one fused kernel (Gemma's 1 + w is folded into w)."""
        return F.rms_norm(x.float(), w.shape, w, self.eps)

    def _rope(self, positions: torch.Tensor) -> dict:
        """(cos, sin with rotate-half's sign) (B, S, 1, D) per layer type, from the model's own
        rotary module."""
        rotary, probe = self.body.rotary_emb, torch.empty(0, dtype=torch.float32)
        out = {}
        for t in set(self.layer_types):
            cos, sin = rotary(probe, positions, t) if self.gemma else rotary(probe, positions)
            half = sin.shape[-1] // 2
            sin = torch.cat([-sin[..., :half], sin[..., half:]], -1)
            out[t] = (cos.float()[:, :, None], sin.float()[:, :, None])
        return out

    def _forward(self, ids, positions, allowed, cache: StaticCache) -> torch.Tensor:
        """Hidden states (B, S, H) after the final norm, for `ids` (B, S) written into the cache
        at columns cache.size..+S; `allowed` (per window) is the (B, 1, S, cache.size + S) mask."""
        B, S = ids.shape
        H, Hkv, D = self.heads, self.kv_heads, self.head_dim
        x = (F.embedding(ids, self.embed) * self.embed_scale).float()
        rope = self._rope(positions)
        start, end = cache.size, cache.size + S
        for i, layer in enumerate(self.layers):
            qkv = linear(self._norm(x, layer["input_layernorm"]).to(torch.bfloat16), layer["qkv"])
            qkv = qkv.view(B, S, H + 2 * Hkv, D)
            qk, v = qkv[:, :, :H + Hkv].float(), qkv[:, :, H + Hkv:]
            if self.gemma:
                qk = torch.cat([self._norm(qk[:, :, :H], layer["q_norm"]),
                                self._norm(qk[:, :, H:], layer["k_norm"])], 2)
            cos, sin = rope[self.layer_types[i]]
            qk = (qk * cos + qk.roll(D // 2, -1) * sin).transpose(1, 2)
            cache.k[i][:, :, start:end] = qk[:, H:]
            cache.v[i][:, :, start:end] = v.transpose(1, 2)
            a = self._attend(qk[:, :H], cache.k[i][:, :, :end], cache.v[i][:, :, :end],
                             allowed[self.windows[i]])
            a = linear(a, layer["o"])
            if self.gemma:
                x = x + self._norm(a, layer["post_attention_layernorm"])
                h = self._norm(x, layer["pre_feedforward_layernorm"])
            else:
                x = x + a
                h = self._norm(x, layer["post_attention_layernorm"])
            gate, up = linear(h.to(torch.bfloat16), layer["gate_up"]).chunk(2, -1)
            h = linear(self.act(gate) * up, layer["down"])
            x = x + (self._norm(h, layer["post_feedforward_layernorm"]) if self.gemma else h)
        cache.size = end
        return self._norm(x, self.final_norm)

    def _attend(self, q, k, v, allowed) -> torch.Tensor:
        """Attention of q (B, H, S, D) over the cache's k, v (B, Hkv, K, D) -> (B, S, H * D)
        in bf16 for the output projection."""
        B, H, S, D = q.shape
        if S > 1:  # the prompt pass
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=self.scale,
                                               enable_gqa=H != self.kv_heads)
            return a.transpose(1, 2).reshape(B, S, H * D).to(torch.bfloat16)
        Hkv = self.kv_heads  # one step: each kv head's group of queries, as one batched product
        q = q.reshape(B * Hkv, H // Hkv, D)
        k, v = k.flatten(0, 1), v.flatten(0, 1)  # views of the cache's (B * Hkv, K, D) columns
        scores = torch.baddbmm(allowed, q, k.transpose(1, 2), alpha=self.scale)
        a = torch.bmm(torch.softmax(scores, -1), v)
        return a.reshape(B, 1, H * D).to(torch.bfloat16)

    def _masks(self, key_mask: torch.Tensor, S: int) -> dict:
        """Per window: which keys (B, 1, S, K) each of the last S queries may attend to (one
        step's as additive biases, see `_attend`)."""
        K = key_mask.shape[1]
        pos = key_mask.long().cumsum(-1) - 1
        q_col = torch.arange(K - S, K, device=key_mask.device)
        causal = torch.arange(K, device=key_mask.device)[None, :] <= q_col[:, None]  # (S, K)
        base = causal[None] & key_mask.bool()[:, None, :]
        out = {}
        for w in set(self.windows):
            m = base
            if w is not None:
                m = m & (pos[:, -S:, None] - pos[:, None, :] < w)
            m = m | (torch.arange(K, device=key_mask.device)[None] == q_col[:, None])[None]
            m = m[:, None]  # a query on padding attends to itself: no empty row
            if S == 1:  # a step adds (B * Hkv, 1, K) biases to its scores: 0 or -inf
                m = torch.zeros(m.shape, device=m.device).masked_fill_(~m, float("-inf"))
                m = m.expand(-1, self.kv_heads, -1, -1).flatten(0, 1)
            out[w] = m
        return out

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """float32 logits of the last hidden state (B, H)."""
        z = linear(h.to(torch.bfloat16), self.head).float()
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z

    # -- begin / sample / feed (as the policy's) ----------------------------------------------

    def begin(self, prompt_ids, prompt_mask, sampling: SamplingConfig | None = None,
              max_new_tokens: int | None = None, repeat: int = 1) -> DecodeState:
        """The prompt pass into a static cache sized for `max_new_tokens` more tokens."""
        sampling = sampling or SamplingConfig()
        with torch.inference_mode():
            self.refresh()
            prompt_ids, prompt_mask = trim_left_padding(prompt_ids, prompt_mask)
            B, P = prompt_ids.shape
            cache = StaticCache(len(self.layers), B, self.kv_heads, P + (max_new_tokens or 0) + 1,
                                self.head_dim, prompt_ids.device)
            positions = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
            h = self._forward(prompt_ids, positions, self._masks(prompt_mask, P), cache)
            logits = self._logits(h[:, -1])
            value = torch.zeros(B)  # values come from the trainer's full pass
            return prompt_state(cache, prompt_ids, prompt_mask, logits, value, sampling,
                                self.policy.vocab_size, repeat)

    def feed(self, state: DecodeState, token: torch.Tensor, active: torch.Tensor | None = None):
        """Append one token per row (inactive rows: pad, mask 0) and run one cached step."""
        with torch.inference_mode():
            token, active, pos = append_token(state, token, active, self.policy.pad_token_id)
            h = self._forward(token[:, None], pos, self._masks(state.mask, 1), state.cache)
            state.logits = self._logits(h[:, -1])
            mark_seen(state, token, active)
        return state


def decodes_fast(policy) -> bool:
    """Whether `policy` decodes on the fast path (an engine is attached to it)."""
    return getattr(policy, "engine", None) is not None


def attach(policy, path: str = "auto") -> str:
    """Give `policy` the fast decode path where `path` ("auto", "fast", "exact") asks for it
    and it runs; return, in words, the path it decodes on (with why, where not the fast one)."""
    policy.engine = None
    if path == "exact":
        return "exact decode path (decode=exact)"
    why = DecodeEngine.unsupported(policy)
    if why is None:
        policy.engine = DecodeEngine(policy)
        return "fast decode path (folded bf16 weights, agents/llm/engine.py)"
    if path == "fast":
        raise ValueError(f"decode='fast' cannot run this model: {why}; use decode='auto' "
                         f"(falls back to the exact path) or 'exact'")
    return f"exact decode path (the fast one cannot run {why})"
