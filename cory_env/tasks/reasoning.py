"""`reasoning`: verifiable problems from reasoning-gym, the paper's GSM8K setting offline.

    cory_env.make_task("reasoning")                                # easy basic arithmetic
    cory_env.make_task("reasoning", dataset="chain_sum", min_terms=2, max_terms=3)

Any single-answer reasoning-gym dataset works (`dataset=` its name; other options go to its
generator). Splits, the one-shot "Question: ...\nAnswer:" prompt with the observer's
"Reference:" line, and the exact-match reward are the library adapter's (`library.py`); the
answer is the response's first line (its last number, when the answer is a number), scored by
the dataset's own `score_answer`. The default difficulty (two one-digit terms, + - *: 300
questions, 69 held out by a hash of the text) is where SmolLM2-135M-Instruct's pass@1 starts
between 10% and 40% (docs/environment.md has the measured difficulties).
"""

from __future__ import annotations

import importlib.util
import re

from cory_common.checks import check_int

from .base import Query, last_number, register_task
from .library import SEEDS, LibraryTask

EASY = {"basic_arithmetic": dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1,
                                 operators=("+", "-", "*"), allow_parentheses=False,
                                 allow_negation=False)}
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def check_reasoning_gym() -> None:
    """A ValueError with the install command when reasoning-gym is missing."""
    if importlib.util.find_spec("reasoning_gym") is None:
        raise ValueError("the reasoning task needs the reasoning-gym package: "
                         "pip install reasoning-gym")


def extract_answer(response: str, numeric: bool) -> str:
    """The answer in a response: its first non-empty line (that line's last number when the
    expected answer is a number)."""
    line = next((x.strip() for x in response.splitlines() if x.strip()), "")
    if numeric:
        return last_number(line) or ""
    return line.rstrip(".")


@register_task("reasoning")
class ReasoningTask(LibraryTask):
    """A reasoning-gym dataset through the library adapter (`library.LibraryTask`)."""

    name = "reasoning"

    def __init__(self, dataset: str = "basic_arithmetic", n_queries: int = 2048, shots: int = 1,
                 tokenizer: str = "smollm2-135m", **options):
        check_reasoning_gym()
        import reasoning_gym

        if dataset not in reasoning_gym.factory.DATASETS:
            raise ValueError(f"reasoning: unknown reasoning-gym dataset {dataset!r}; known: "
                             f"{', '.join(sorted(reasoning_gym.factory.DATASETS))}")
        check_int("shots", shots, 1)  # a solved example shows the answer's format
        super().__init__(n_queries, shots, tokenizer)
        self.dataset = dataset
        self.options = {**EASY.get(dataset, {}), **options}
        try:
            self.draw(SEEDS["example"], 1)  # the options are checked by the generator itself
        except Exception as err:
            raise ValueError(f"reasoning: dataset {dataset!r} refused the options "
                             f"{self.options}: {err}") from None

    def draw(self, seed: int, size: int) -> list[Query]:
        """`size` problems of the dataset's generator at `seed`, each with its answer."""
        import reasoning_gym

        data = reasoning_gym.create_dataset(self.dataset, seed=seed, size=size, **self.options)
        return [Query(text=e["question"], answer=str(e["answer"]), meta={"entry": e, "data": data})
                for e in data]

    def extract(self, query: Query, response: str) -> str:
        """The first line (its last number when the answer is a number)."""
        return extract_answer(response, bool(_NUMBER.match(query.answer or "")))

    def solved(self, query: Query, answer: str) -> bool:
        """reasoning-gym's `score_answer` gives a full score."""
        return query.meta["data"].score_answer(answer, query.meta["entry"]) >= 1.0
