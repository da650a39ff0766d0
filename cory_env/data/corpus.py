"""The offline tasks' pretraining mixtures: the texts their reference LMs and tokenizers learn from
(the corpora themselves: `sentiment_corpus`, `arithmetic_corpus`).
"""

import random

from .arithmetic_corpus import arith_prompt, arithmetic_problems, arithmetic_references
from .sentiment_corpus import sentiment_reviews, sentiment_rewrites

# ---------------------------------------------------------------------------------------------
# Pretraining mixtures
# ---------------------------------------------------------------------------------------------


def pretraining_texts(task: str, n: int, seed: int) -> list[str]:
    """Return ``n`` shuffled pretraining strings for "sentiment" or "arithmetic" (train only)."""
    if task == "sentiment":
        k = round(0.7 * n)
        texts = [t for t, _ in sentiment_reviews(k, seed)] + sentiment_rewrites(n - k, seed + 1)
    elif task == "arithmetic":
        k = round(0.6 * n)
        pairs = [f"{arith_prompt(p['question'])} {p['solution']}"
                 for p in arithmetic_problems(k, seed, "train")]
        texts = pairs + arithmetic_references(n - k, seed + 1)
    else:
        raise ValueError(f"unknown task {task!r}")
    random.Random(seed).shuffle(texts)
    return texts
