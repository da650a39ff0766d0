"""`reviews`: the paper's IMDB setting with a real model and a real reward, offline.

Queries are the first 2-8 tokens of movie-review openings (`cory_env.data.openings`, a few
thousand written from a grammar), cut with the run's tokenizer as the paper cuts IMDB reviews.
An opening belongs to the test split by a hash of its text, and a test query whose cut text
also occurs in training is dropped, so the held-out split shares no query with training.
The reward is VADER's compound score of query + response, times `reward_scale` (3 by default:
[-3, 3], near the paper's classifier-logit range). The observer template is the paper's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cory_common.checks import check_int
from cory_common.pretrained import load_tokenizer

from ..data.openings import review_openings
from .base import Query, Task, held_out, register_task
from .hf import IMDB_OBSERVER, prefix_queries, rewrite_chain
from .rewards import VADER_SCALE, check_scale, check_vader, vader

TEST_SHARE = 8  # one opening in 8 is held out


def split_of(text: str) -> str:
    """The split an opening belongs to, by a hash of its text."""
    return "test" if held_out(text, TEST_SHARE) else "train"


@register_task("reviews")
class ReviewsTask(Task):
    """Continue a movie-review opening; reward = reward_scale x VADER compound."""

    name = "reviews"
    observer_template = IMDB_OBSERVER
    takes_run_tokenizer = True
    default_max_new_tokens = 12
    default_context_len = 64

    def __init__(self, n_queries: int | None = None, prompt_tokens: tuple = (2, 8),
                 reward_scale: float = VADER_SCALE, tokenizer: str = "smollm2-135m"):
        super().__init__()
        check_vader()
        self.reward_scale = check_scale("reward_scale", reward_scale)
        check_int("n_queries", n_queries, 1, none_ok=True)
        lo, hi = _token_range(prompt_tokens)
        self.n_queries, self.prompt_tokens, self.tokenizer_name = n_queries, (lo, hi), tokenizer

    def chain_template(self, position: int) -> str:
        """Chain position >= 2: the earlier continuations listed (`rewrite_chain`)."""
        return rewrite_chain(position)

    def build_tokenizer(self):
        """SmolLM2's tokenizer by default (the run's model's when it has one)."""
        return load_tokenizer(self.tokenizer_name)

    def load_queries(self, split: str) -> list[Query]:
        """Each split's openings cut to 2-8 tokens, deduplicated; test drops train's."""
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; use train or test")
        queries = self._cut(split)
        if split == "test":  # every training opening's cut text, n_queries or not
            seen = {q.text for q in self._cut("train")}
            queries = [q for q in queries if q.text not in seen]
        return queries[: self.n_queries]

    def _cut(self, split: str) -> list[Query]:

        texts = [t for t in review_openings() if split_of(t) == split]
        out, seen = [], set()
        for q in prefix_queries(texts, self.tokenizer, self.prompt_tokens, seed=0):
            if q.text.strip() and q.text not in seen:
                seen.add(q.text)
                out.append(q)
        return out

    def reward(self, queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
        """reward_scale x VADER compound of query + response."""
        return vader([q.text + r for q, r in zip(queries, responses)], self.reward_scale)


def _token_range(value) -> tuple[int, int]:
    """(lo, hi) from a 2-sequence of positive integers with lo <= hi, naming bad values."""
    ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    if not ok or value[0] > value[1]:
        raise ValueError(f"prompt_tokens must be (min, max) positive integers with min <= max, "
                         f"got {value!r}")
    return int(value[0]), int(value[1])
