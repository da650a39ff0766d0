"""Shared test helpers: a tiny word-level task and GPT-2 that build in milliseconds, offline."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from cory_env import Query, Task

needs_cxx = pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                               reason="torch.compile's CPU backend needs a C++ compiler")

WORDS = ["<eos>", "the", "movie", "was", "good", "bad", "great", "awful", "plot", "acting",
         "is", "very", "not", "I", "liked", "it", "more", "positive", ":", '"', "can", "make",
         "this", "sentence", "and"]


def toy_tokenizer() -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over WORDS; <eos> is eos and pad."""
    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


class ToyTask(Task):
    """Review prefixes; reward = (#good + #great) - (#bad + #awful) in the response."""

    name = "toy"
    observer_template = 'I can make this sentence " {query} {response} " more positive : {query}'
    default_max_new_tokens = 4
    default_context_len = 40
    PROMPTS = ["the movie was", "the plot is", "I liked", "the acting is very", "it was not"]

    def __init__(self, fail_on: str | None = None, nan_on: str | None = None):
        super().__init__()
        self.fail_on, self.nan_on = fail_on, nan_on

    def build_tokenizer(self):
        return toy_tokenizer()

    def load_queries(self, split):
        return [Query(p) for p in self.PROMPTS]

    def reward(self, queries, responses):
        out = []
        for r in responses:
            if self.fail_on and self.fail_on in r:
                raise ZeroDivisionError("boom")
            words = r.split()
            score = sum(w in ("good", "great") for w in words) - sum(
                w in ("bad", "awful") for w in words)
            out.append(float("nan") if self.nan_on and self.nan_on in r else score)
        return np.array(out, dtype=np.float32)



def save_toy_lm(path) -> str:
    """A tiny random GPT-2 with the toy tokenizer, saved as an HF folder."""
    tok = toy_tokenizer()
    tok.save_pretrained(path)
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(tok), n_positions=64,
                     eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    GPT2LMHeadModel(cfg).save_pretrained(path)
    return str(path)


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (a byte-level BPE's base vocabulary)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = [b for b in range(256) if b not in keep]
    return [chr(b) for b in keep] + [chr(256 + i) for i in range(len(extra))]


def write_tiny_gguf(path, arch: str = "llama", hidden: int = 32, layers: int = 2,
                    seed: int = 0) -> str:
    """A tiny random Llama (byte-level BPE tokenizer, EOS <|im_end|>) as a GGUF file,
    written with the `gguf` package as llama.cpp's converter writes one."""
    import gguf

    rng = np.random.default_rng(seed)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    merges = ["Ġ t", "h e", "Ġt he", "Ġ m", "o v", "Ġm ov", "i e", "Ġmov ie", "Ġ w", "a s"]
    tokens = specials + _byte_symbols() + [m.replace(" ", "") for m in merges]
    heads, kv, ff = 4, 2, 2 * hidden
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test-llama")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    kv_dim = kv * hidden // heads
    w.add_tensor("token_embd.weight", rand(len(tokens), hidden))
    matrices = {"attn_q": (hidden, hidden), "attn_k": (kv_dim, hidden),
                "attn_v": (kv_dim, hidden), "attn_output": (hidden, hidden)}
    return _finish_gguf(w, path, layers, hidden, ff, rand, matrices,
                        {"attn_norm": hidden, "ffn_norm": hidden})


def _finish_gguf(w, path, layers: int, hidden: int, ff: int, rand, matrices: dict,
                 norms: dict) -> str:
    """Write each block's matrices (plus the gated MLP) and norms, the output norm, and the
    file."""
    matrices = {**matrices, "ffn_gate": (ff, hidden), "ffn_up": (ff, hidden),
                "ffn_down": (hidden, ff)}
    for i in range(layers):
        for name, shape in matrices.items():
            w.add_tensor(f"blk.{i}.{name}.weight", rand(*shape))
        for norm, size in norms.items():
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(size, np.float32))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def mechanism_measurement() -> dict:
    """A saved mechanism measurement (`benchmarks.mechanism.measure`) with made-up intervals."""
    iv = {"mean": 0.1, "low": 0.05, "high": 0.15, "n": 3, "detectable": 0.05}
    gains = ("alone_ppo", "alone_observer_only", "as_observer_pioneer_only",
             "as_observer_observer_only")
    return {"knowledge_transfer": {"from_answer": iv, "from_instruction": iv, "total": iv},
            "cross_role": {"ratio": iv, "reverse": iv, "per_seed": [{"ratio": 0.1}] * 3,
                           **{f"gain_{k}": iv for k in gains}},
            "verdict": "absent", "queries": 128, "seeds": [0, 1, 2],
            "budget": {"iterations": 20, "batch_size": 32, "lr": 1e-4}}


def write_tiny_gemma3_gguf(path, hidden: int = 32, layers: int = 2, seed: int = 0) -> str:
    """A tiny random Gemma 3 as a GGUF file, laid out as Gemma 3 270M's: a SentencePiece
    vocabulary (<pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4, byte fallback) that adds BOS,
    tied embeddings, q/k norms, sliding-window and full attention layers."""
    import gguf

    rng = np.random.default_rng(seed)
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁the", "▁movie", "▁was", "▁good", "▁bad",
              "▁I", "▁it", ".", ",", ":", '"']
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [3] * len(specials) + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(len(pieces))]
    heads, kv, head_dim, ff = 2, 1, 16, 2 * hidden
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_name("tiny-test-gemma3")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(8)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(len(tokens), hidden))
    matrices = {"attn_q": (heads * head_dim, hidden), "attn_k": (kv * head_dim, hidden),
                "attn_v": (kv * head_dim, hidden), "attn_output": (hidden, heads * head_dim)}
    norms = {"attn_norm": hidden, "ffn_norm": hidden, "post_attention_norm": hidden,
             "post_ffw_norm": hidden, "attn_q_norm": head_dim, "attn_k_norm": head_dim}
    return _finish_gguf(w, path, layers, hidden, ff, rand, matrices, norms)
