"""Single-turn, verifiable problems from the field's environment libraries, as CORY tasks.

`LibraryTask` is the adapter. A library gives problems from a seeded generator (a question,
perhaps its answer, and what its scorer needs) and says whether an answer solves one; the
adapter gives the rest, the same for every library:
- splits: each split draws `n_queries` problems from its own generator seed and keeps those
  whose question falls in it by a hash (one question in 5 is held out), so no question is in
  both; the test split keeps each question once;
- prompts: the paper's GSM8K form, `shots` solved examples then "Question: ...\\nAnswer:"; the
  observer's adds "Reference: <the pioneer's answer>", a chain numbered references;
- tokens: the run's tokenizer (SmolLM2's when a run brings none);
- reward: 1 when the library's own scorer says the answer's first line solves the problem,
  else 0 (exact match, so pass@k and greedy accuracy apply).

Adapters: `reasoning` (reasoning-gym's datasets, `reasoning.py`) and `textarena` (TextArena's
single-turn games, `textarena.py`). A new one subclasses `LibraryTask`, implements `draw`
and `solved`, and registers a name.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import numpy as np

from cory_common.checks import check_int
from cory_common.pretrained import load_tokenizer

from .base import Query, Task, held_out
from .hf import reference_chain

# split -> generator seed; libraries seed item i with seed + i, so the splits lie far apart
SEEDS = {"train": 0, "test": 10_000_000, "example": 20_000_000}
TEST_SHARE = 5


class LibraryTask(Task):
    """A library's single-turn problems with the one-shot Question/Answer template; exact match."""

    takes_run_tokenizer = True
    exact_match = True
    default_max_new_tokens = 16
    default_context_len = 160

    def __init__(self, n_queries: int = 2048, shots: int = 1, tokenizer: str = "smollm2-135m"):
        super().__init__()
        check_int("n_queries", n_queries, 1)
        check_int("shots", shots, 0)
        self.n_queries, self.shots, self.tokenizer_name = n_queries, shots, tokenizer
        self._one_shot: str | None = None

    # -- what a library gives ------------------------------------------------------------------
    @abstractmethod
    def draw(self, seed: int, size: int) -> list[Query]:
        """`size` problems from the library's generator at `seed` (answers where known)."""

    @abstractmethod
    def solved(self, query: Query, answer: str) -> bool:
        """Whether the library scores `answer` (a response's first line) as a full solution."""

    def extract(self, query: Query, response: str) -> str:
        """The answer in a response: its first non-empty line."""
        return next((x.strip() for x in response.splitlines() if x.strip()), "")

    # -- the same for every library ------------------------------------------------------------
    @property
    def one_shot(self) -> str:
        """The solved examples that open every prompt (drawn from the example seed)."""
        if self._one_shot is None:
            shots = self.draw(SEEDS["example"], self.shots) if self.shots else []
            self._one_shot = "".join(f"Question: {q.text}\nAnswer: {q.answer}\n" for q in shots)
        return self._one_shot

    @property
    def pioneer_template(self) -> str:
        """The solved examples, then the question."""
        return self.one_shot + "Question: {query}\nAnswer:"

    @property
    def observer_template(self) -> str:
        """The pioneer's prompt with its answer as a `Reference:` line (the paper's GSM8K)."""
        return self.one_shot + "Question: {query}\nReference: {response}\nAnswer:"

    def chain_template(self, position: int) -> str:
        """Chain position >= 2: numbered references (`reference_chain`)."""
        return reference_chain(self.one_shot, position)

    def build_tokenizer(self):
        """SmolLM2's tokenizer by default (the run's model's when it has one)."""
        return load_tokenizer(self.tokenizer_name)

    def load_queries(self, split: str) -> list[Query]:
        """The problems among n_queries drawn for a split whose question falls in it by a hash
        (one in TEST_SHARE is held out); test keeps each question once."""
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; use train or test")
        out, seen = [], set()
        for q in self.draw(SEEDS[split], self.n_queries):
            if held_out(q.text, TEST_SHARE) == (split == "test") and \
                    not (split == "test" and q.text in seen):
                seen.add(q.text)
                out.append(q)
        return out

    def reward(self, queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
        """1 where the library scores the response's answer as a full solution, else 0."""
        return np.array([float(bool(a) and self.solved(q, a)) for q, r in zip(queries, responses)
                         for a in [self.extract(q, r)]], dtype=np.float32)
