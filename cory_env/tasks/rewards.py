"""Rewards from the field's libraries: VADER sentiment and a sequence classifier's logit.

    score = vader(texts, scale=3.0)     # 3 x VADER compound, in [-3, 3]

VADER (Hutto & Gilbert 2014, the `vadersentiment` package) is a rule- and lexicon-based
scorer whose lexicon ships inside the wheel: no download, deterministic, about 0.1 ms a text.
Its compound score is in [-1, 1]; 3x puts it near the range of the paper's distilbert-imdb
logit (about -3 to 3 on reviews).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence

import numpy as np

VADER = "vader"
VADER_SCALE = 3.0


def check_vader() -> None:
    """A ValueError with the install command when vadersentiment is missing."""
    if importlib.util.find_spec("vaderSentiment") is None:
        raise ValueError("the VADER reward needs the vadersentiment package: "
                         "pip install vadersentiment")


@functools.lru_cache(maxsize=1)
def _analyzer():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def vader(texts: Sequence[str], scale: float = VADER_SCALE) -> np.ndarray:
    """scale x VADER's compound score of each text, float32 (len(texts),)."""
    check_vader()
    score = _analyzer().polarity_scores
    return np.array([scale * score(t)["compound"] for t in texts], dtype=np.float32)


def check_scale(name: str, value) -> float:
    """A positive finite float, or a ValueError naming the option."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)
