"""`reasoning`: verifiable problems from reasoning-gym, the paper's GSM8K setting offline.

    cory_env.make_task("reasoning")                                # easy basic arithmetic
    cory_env.make_task("reasoning", dataset="chain_sum", min_terms=2, max_terms=3)

Any single-answer reasoning-gym dataset works (`dataset=` its name; other options go to its
generator). Each split draws `n_queries` problems from its own generator seed and keeps those
whose question falls in it by a hash (one question in 5 is held out), so no question is in
both; the test split keeps each question once. The prompt is the paper's GSM8K one-shot form
("Question: ...\\nAnswer:", `shots` solved examples of a third seed first); the observer's
adds "Reference: <the pioneer's answer>". The reward is exact match: the first line of the
answer (its last number, when the answer is a number) scored by the dataset's own
`score_answer`, 1 for a full score and 0 otherwise, so pass@k applies. The default difficulty
(two one-digit terms, + - *: 300 questions, 60 held out) is where SmolLM2-135M-Instruct's
pass@1 starts between 10% and 40% (docs/environment.md has the measured difficulties).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Sequence

import numpy as np

from ..checks import check_int
from .base import Query, Task, held_out, last_number, register_task
from .hf import reference_chain

# reasoning-gym seeds item i with seed + i: the splits' seeds lie far apart
SEEDS = {"train": 0, "test": 10_000_000, "example": 20_000_000}
TEST_SHARE = 5
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
class ReasoningTask(Task):
    """A reasoning-gym dataset with the one-shot Question/Answer template; exact match."""

    name = "reasoning"
    takes_run_tokenizer = True
    exact_match = True
    default_max_new_tokens = 16
    default_context_len = 160

    def __init__(self, dataset: str = "basic_arithmetic", n_queries: int = 2048, shots: int = 1,
                 tokenizer: str = "smollm2-135m", **options):
        super().__init__()
        check_reasoning_gym()
        import reasoning_gym

        if dataset not in reasoning_gym.factory.DATASETS:
            raise ValueError(f"reasoning: unknown reasoning-gym dataset {dataset!r}; known: "
                             f"{', '.join(sorted(reasoning_gym.factory.DATASETS))}")
        for name, value in (("n_queries", n_queries), ("shots", shots)):
            check_int(name, value, 1)
        self.dataset, self.n_queries, self.tokenizer_name = dataset, n_queries, tokenizer
        self.options = {**EASY.get(dataset, {}), **options}
        try:
            self._generator("example", 1)  # the options are checked by the generator itself
        except Exception as err:
            raise ValueError(f"reasoning: dataset {dataset!r} refused the options "
                             f"{self.options}: {err}") from None
        self._one_shot = "".join(f"Question: {e['question']}\nAnswer: {e['answer']}\n"
                                 for e in self._generator("example", shots))

    def _generator(self, split: str, size: int):
        import reasoning_gym

        return reasoning_gym.create_dataset(self.dataset, seed=SEEDS[split], size=size,
                                            **self.options)

    @property
    def pioneer_template(self) -> str:
        """One solved example, then the question."""
        return self._one_shot + "Question: {query}\nAnswer:"

    @property
    def observer_template(self) -> str:
        """The pioneer's prompt with its answer as a `Reference:` line (the paper's GSM8K)."""
        return self._one_shot + "Question: {query}\nReference: {response}\nAnswer:"

    def chain_template(self, position: int) -> str:
        """Chain position >= 2: numbered references (`reference_chain`)."""
        return reference_chain(self._one_shot, position)

    def build_tokenizer(self):
        """SmolLM2's tokenizer by default (the run's model's when it has one)."""
        from ..config import load_tokenizer

        return load_tokenizer(self.tokenizer_name)

    def load_queries(self, split: str) -> list[Query]:
        """The problems among n_queries drawn for a split whose question falls in it by a hash
        (one in TEST_SHARE is held out); test keeps each question once."""
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; use train or test")
        data, out, seen = self._generator(split, self.n_queries), [], set()
        for e in data:
            q = e["question"]
            if held_out(q, TEST_SHARE) == (split == "test") and not (split == "test" and q in seen):
                seen.add(q)
                out.append(Query(text=q, answer=str(e["answer"]), meta={"entry": e, "data": data}))
        return out

    def reward(self, queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
        """1 where the dataset scores the extracted answer as fully correct, else 0."""
        out = []
        for q, r in zip(queries, responses):
            answer = extract_answer(r, bool(_NUMBER.match(q.answer or "")))
            score = q.meta["data"].score_answer(answer, q.meta["entry"]) if answer else 0.0
            out.append(float(score >= 1.0))
        return np.array(out, dtype=np.float32)
