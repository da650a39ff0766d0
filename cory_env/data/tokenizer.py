"""The offline tasks' byte-level BPE tokenizers, trained from their corpora and cached.

Trained in seconds on a CPU, cached under ``cache_dir()`` and memoised in-process, so no
network or model hub is ever needed.
"""

import functools
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from cory_common.files import cache_dir, cached_dir

from . import arithmetic_corpus, corpus, sentiment_corpus

EOS = "<|endoftext|>"
_TOKENIZER_TEXTS = 4000


@dataclass(frozen=True)
class TokenizerRecipe:
    """How an offline task's BPE tokenizer is trained: its vocabulary, the prompt templates it
    must see besides the corpus, and a version to bump when that corpus changes (the task's
    LM version too)."""

    vocab_size: int
    version: str
    templates: tuple[str, ...]


# One recipe per offline task (the agents' side of each is `agents/refmodels/sizes.py`).
RECIPES = {
    "sentiment": TokenizerRecipe(
        1024, "v1", (sentiment_corpus.REWRITE_TEMPLATE.format(text="", query=""),)),
    "arithmetic": TokenizerRecipe(768, "v2", (arithmetic_corpus.arith_prompt("", ""),)),
}
TASKS = tuple(RECIPES)


def _train_tokenizer(task: str, out: Path) -> None:
    """Train a byte-level BPE with single-digit tokens on ``task``'s texts; save it to ``out``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPES[task].vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [*RECIPES[task].templates, *corpus.pretraining_texts(task, _TOKENIZER_TEXTS, seed=0)]
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS, pad_token=EOS
    )
    fast.save_pretrained(str(out))


@functools.cache
def _load_tokenizer(task: str, root: str) -> PreTrainedTokenizerFast:
    """Load (building first if needed) the tokenizer of ``task`` under cache root ``root``."""
    final = Path(root) / "tokenizers" / f"{task}-{RECIPES[task].version}"
    path = cached_dir(final, lambda out: _train_tokenizer(task, out))
    return AutoTokenizer.from_pretrained(str(path))


def task_tokenizer(task: str) -> PreTrainedTokenizerFast:
    """Return the byte-level BPE tokenizer for "sentiment" or "arithmetic" (cached, memoised)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    return _load_tokenizer(task, str(cache_dir()))
