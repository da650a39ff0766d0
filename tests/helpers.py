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
