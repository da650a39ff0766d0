"""`course`: a tiny colour-naming task for tutorials, interop demos and fast tests (and
`colours`, the exercises' variant whose reward counts colour words).

The query names a thing ("colour of snow ?") and the answer is its colour ("white"):

    reward = 1.0 if the response's first word is the thing's colour, else 0.0

Answers are at most 2 tokens (`<eos>` ends a turn early), so a random pair scores about 0.08
as a team (r_pio + r_obs) and a perfect pair 2.0. The vocabulary has 24 words, built
in-process as a word-level tokenizer (`<eos>` is both eos and pad), so the task needs no
download and the env steps in microseconds.

Knowledge transfer: the observer's prompt shows the pioneer's answer after "hint :", so an
observer that reads its context can copy a good answer; with `knowledge_transfer=False` it gets
only the pioneer's prompt. In a chain of K > 2 agents position k sees one "hint :" per earlier
answer. (The small MLP policy of `agents/interop/tianshou.py` learns about
equally fast either way: for a net without an LLM's knack for copying from context, copying a
word is no easier than learning the 8 thing -> colour pairs.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .base import Query, Task, register_task

EOS = "<eos>"
COLOURS = {"red": "blood", "blue": "sky", "green": "grass", "yellow": "sun",
           "white": "snow", "black": "coal", "pink": "rose", "grey": "ash"}
THINGS = {thing: colour for colour, thing in COLOURS.items()}
PROMPT_WORDS = ("colour", "of", "?", "hint", ":")
FILLERS = ("a", "the")  # never right, always available
WORDS = (EOS, *PROMPT_WORDS, *FILLERS, *COLOURS, *THINGS)


def course_tokenizer():
    """A whitespace word-level tokenizer over the 24 course words; `<eos>` is eos and pad."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def colour_reward(target: str, response: str) -> float:
    """1.0 if the response's first word is the target colour, else 0.0."""
    words = response.split()
    return float(bool(words) and words[0] == target)


@register_task("course")
class CourseTask(Task):
    """Name the colour of a thing; 24-word vocabulary, 2-token answers (see the module doc)."""

    name = "course"
    pioneer_template = "colour of {query} ?"
    observer_template = "colour of {query} ? hint : {response}"
    default_max_new_tokens = 2
    default_context_len = 10  # the observer's prompt is at most 8 tokens

    def chain_template(self, position: int) -> str:
        """Chain position >= 2: one `hint :` per earlier answer."""
        hints = " ".join(f"hint : {{response_{j}}}" for j in range(1, position + 1))
        return "colour of {query} ? " + hints

    def build_tokenizer(self):
        """The in-process word-level tokenizer (no download)."""
        return course_tokenizer()

    def load_queries(self, split: str) -> list[Query]:
        """The 8 things, in a fixed order; both splits hold the same queries."""
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; use 'train' or 'test'")
        return [Query(text=thing, answer=colour) for thing, colour in THINGS.items()]

    def reward(self, queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
        """The colour reward of each response (see `colour_reward`)."""
        return np.array([colour_reward(q.answer, r) for q, r in zip(queries, responses)],
                        dtype=np.float32)


@register_task("colours")
class ColoursTask(CourseTask):
    """The course prompts, but the reward counts colour words in the answer (0, 1 or 2): the
    exercises' task (docs/exercises.md), where copying a good answer pays in full."""

    name = "colours"

    def reward(self, queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
        """Number of colour words in each response."""
        return np.array([sum(w in COLOURS for w in r.split()) for r in responses],
                        dtype=np.float32)
