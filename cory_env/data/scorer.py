"""The sentiment task's reward: a negation-aware unigram+bigram logistic regression.

A stand-in for ``lvwerra/distilbert-imdb``'s POSITIVE logit, fitted on generated reviews in
seconds (numpy only), cached under ``cache_dir()`` and memoised in-process.
"""

import functools
import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np

from cory_common.files import cache_dir, cached_dir

from . import sentiment_corpus

_TOKEN = re.compile(r"[a-z0-9']+|[.,;:!?]")
_NEGATORS = {"not", "never", "hardly", "no", "without", "nor"}
_SCOPE = 3  # words after a negator that are marked as negated
_TRAIN_SEED, _HELDOUT_SEED = 1_000, 2_000
_N_TRAIN, _N_HELDOUT = 10_000, 4_000


def _words(text: str) -> list[str]:
    """Lower-cased words; up to 3 words after a negator (within a clause) get a "not_" mark."""
    out, scope, prev = [], 0, ""
    for tok in _TOKEN.findall(text.lower()):
        if not tok[0].isalnum():
            scope = 0
        elif scope:
            out.append("not_" + tok)
            scope -= 1
        else:
            out.append(tok)
        if tok in _NEGATORS or tok.endswith("n't") or (prev, tok) == ("far", "from"):
            scope = _SCOPE
        prev = tok
    return out


def _features(text: str) -> list[str]:
    """Negation-marked unigrams and bigrams of ``text``."""
    toks = _words(text)
    return toks + [f"{a} {b}" for a, b in zip(toks, toks[1:], strict=False)]


def _sparse(features: list[list[str]], index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) arrays of the known features present in each text, plus a bias column."""
    bias = len(index)
    ids = [sorted({index[f] for f in feats if f in index}) + [bias] for feats in features]
    rows = np.repeat(np.arange(len(features)), [len(x) for x in ids])
    return rows, np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=len(rows))


def _logits(weights: np.ndarray, rows: np.ndarray, cols: np.ndarray, n: int) -> np.ndarray:
    """Sum the weights of each row's features (bias included)."""
    return np.bincount(rows, weights=weights[cols], minlength=n)


def _fit(rows, cols, y, n_weights, steps=200, lr=0.1, l2=1e-4) -> np.ndarray:
    """Full-batch Adam on the L2-regularised logistic loss; returns the weight vector."""
    w, m, v = np.zeros(n_weights), np.zeros(n_weights), np.zeros(n_weights)
    for t in range(1, steps + 1):
        p = 1.0 / (1.0 + np.exp(-_logits(w, rows, cols, len(y))))
        grad = np.bincount(cols, weights=(p - y)[rows], minlength=n_weights) / len(y) + l2 * w
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad**2
        w -= lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    return w


@dataclass(frozen=True, eq=False)
class SentimentScorer:
    """Unigram+bigram logistic regression; ``scorer(texts)`` gives POSITIVE-class logits."""

    index: dict[str, int]
    weights: np.ndarray
    accuracy: float

    def __call__(self, texts: list[str]) -> np.ndarray:
        """Return one float32 positive-class logit per text."""
        rows, cols = _sparse([_features(t) for t in texts], self.index)
        return _logits(self.weights, rows, cols, len(texts)).astype(np.float32)


def _with_prefixes(reviews: list[tuple[str, int]], seed: int) -> list[tuple[str, int]]:
    """Add a 4-20 word prefix of every review, so short texts are scored like their opening."""
    rng = random.Random(seed)
    prefixes = [(" ".join(t.split()[: rng.randint(4, 20)]), y) for t, y in reviews]
    return reviews + prefixes


def _train_scorer(out: Path) -> None:
    """Fit the scorer on generated reviews, measure held-out accuracy, save it to ``out``."""
    train = _with_prefixes(sentiment_corpus.sentiment_reviews(_N_TRAIN, _TRAIN_SEED), _TRAIN_SEED)
    features = [_features(t) for t, _ in train]
    counts = Counter(chain.from_iterable(set(f) for f in features))
    vocab = sorted(f for f, c in counts.items() if c >= 2)
    index = {f: i for i, f in enumerate(vocab)}
    rows, cols = _sparse(features, index)
    weights = _fit(rows, cols, np.array([y for _, y in train], float), len(vocab) + 1)
    heldout = sentiment_corpus.sentiment_reviews(_N_HELDOUT, _HELDOUT_SEED)
    scorer = SentimentScorer(index, weights, 0.0)
    pred = scorer([t for t, _ in heldout]) > 0
    accuracy = float(np.mean(pred == np.array([y for _, y in heldout], bool)))
    (out / "vocab.json").write_text(json.dumps(vocab))
    np.save(out / "weights.npy", weights)
    (out / "meta.json").write_text(json.dumps({"accuracy": accuracy, "n_train": _N_TRAIN}))


@functools.cache
def _load_scorer(root: str) -> SentimentScorer:
    """Load (training first if needed) the sentiment scorer under cache root ``root``."""
    path = cached_dir(Path(root) / "scorers" / "sentiment-v1", _train_scorer)
    vocab = json.loads((path / "vocab.json").read_text())
    meta = json.loads((path / "meta.json").read_text())
    weights = np.load(path / "weights.npy")
    return SentimentScorer({f: i for i, f in enumerate(vocab)}, weights, meta["accuracy"])


def sentiment_scorer() -> SentimentScorer:
    """Return the cached sentiment scorer (a stand-in for lvwerra/distilbert-imdb logits)."""
    return _load_scorer(str(cache_dir()))
