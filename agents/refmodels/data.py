"""Training sequences of the reference LMs, assembled exactly as the env assembles its prompts.

The static pieces of the task's pioneer/observer templates are tokenized on their own and the
query/response token ids are inserted as they are (see ``cory_env.prompts.TemplateRenderer``), so
a prompt the env shows the model has the same tokens as the pretraining data, including the
lone space token after ``Question: `` and ``positive: `` that whole-text tokenization would
merge into the next word.

- ``sentiment``: whole generated reviews (the pioneer's job: continue a 2-8 token prefix) and,
  a share ``RECIPES["sentiment"].mix["observer"]`` of the time (0.6 in the "full" size), observer
  sequences: the observer template filled with a review prefix and its next (usually 12)
  tokens, followed by the more positive rewrite (``sentiment_corpus.positivise``) of those tokens.
- ``arithmetic``: 25% pioneer sequences (one-shot prompt, question, worked solution), 75%
  observer sequences whose ``Reference:`` is a right or wrong solution (half each, cut to the
  env's 40 response tokens), followed by the right solution.

Every sequence ends with EOS and starts at position 0 (no packing), as env prompts do.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cory_env import make_task
from cory_env.data import arithmetic_corpus, sentiment_corpus
from cory_env.data.tokenizer import TASKS, task_tokenizer
from cory_env.prompts import TemplateRenderer
from cory_env.tasks.base import Template

from .sizes import MIXES

TRAIN_SEED, HELDOUT_SEED = 31, 97  # corpus seeds; the env's queries use seeds 0/1 and 1000/1001


def check_task(task: str) -> None:
    """Raise ValueError unless the task has an offline reference LM."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def _pieces(template: str, tokenizer) -> list:
    """The env's own tokenization of a template: static ids arrays and slot names."""
    return TemplateRenderer(Template(template), tokenizer).pieces


def _assemble(pieces: list, query: Sequence[int], response: Sequence[int] = ()) -> list[int]:
    """Concatenate template pieces with the query/response ids, as the env's renderer does."""
    out: list[int] = []
    for piece in pieces:
        if isinstance(piece, str):  # the query
            out.extend(query)
        elif isinstance(piece, int):  # the previous answer
            out.extend(response)
        else:
            out.extend(int(i) for i in piece)
    return out


@dataclass
class Sequences:
    """Token sequences (each ending with EOS) and the length of each one's prompt part."""

    ids: list[list[int]]
    prompt_lens: list[int]


class TrainingData:
    """Generates a task's token sequences (and held-out evaluation material)."""

    def __init__(self, task: str, mix: dict | None = None):

        self.name = task
        self.mix = {**MIXES[task], **(mix or {})}
        self.task = make_task(task)
        self.tok = task_tokenizer(task)
        self.eos = self.tok.eos_token_id
        self.max_new = self.task.default_max_new_tokens
        self.pio = _pieces(self.task.pioneer_template, self.tok)
        self.obs = _pieces(self.task.observer_template, self.tok)

    # -- sentiment ------------------------------------------------------------------------
    def reviews(self, n: int, seed: int) -> list[list[int]]:
        """Token ids of ``n`` generated reviews (the env cuts its prefixes from such ids)."""
        texts = [t for t, _ in sentiment_corpus.sentiment_reviews(n, seed)]
        return self.tok(texts, add_special_tokens=False)["input_ids"]

    def split_review(self, ids: list[int], rng: random.Random) -> tuple[list, list]:
        """A 2-8 token prefix (the env's query) and its next tokens (a pioneer's response)."""
        k = min(rng.randint(2, 8), len(ids) - 1)
        m = self.max_new if rng.random() < 0.75 else rng.randint(3, self.max_new - 1)
        return ids[:k], ids[k:k + m]

    def rewrite(self, query: list[int], cont: list[int], rng: random.Random) -> list[int]:
        """The more positive version of ``cont`` as tokens that follow ``query``."""
        q_text = self.tok.decode(query)
        new = sentiment_corpus.positivise(self.tok.decode(cont), rng)
        whole = self.tok.encode(q_text + new, add_special_tokens=False)
        if whole[: len(query)] == list(query):
            return whole[len(query):]
        return self.tok.encode(new, add_special_tokens=False)

    def positive_continuations(self, n: int, seed: int) -> dict[tuple, list[list[int]]]:
        """Positive reviews by their 2-8 token prefixes: prefix -> the tokens that follow."""
        texts = [t for t, label in sentiment_corpus.sentiment_reviews(n, seed) if label == 1]
        out: dict[tuple, list[list[int]]] = {}
        for ids in self.tok(texts, add_special_tokens=False)["input_ids"]:
            for k in range(2, min(9, len(ids))):
                out.setdefault(tuple(ids[:k]), []).append(ids[k:])
        return out

    def _sentiment(self, n: int, seed: int) -> list[tuple[list[int], list[int]]]:
        rng = random.Random(f"lm-sentiment:{seed}")
        fresh = self.positive_continuations(n, seed + 7) if self.mix["fresh"] > 0 else {}
        out = []
        for ids in self.reviews(n, seed):
            if rng.random() < self.mix["observer"]:
                query, cont = self.split_review(ids, rng)
                target = self.rewrite(query, cont, rng)
                others = fresh.get(tuple(query))
                if others and rng.random() < self.mix["fresh"]:
                    target = rng.choice(others)[: max(len(cont), 1)]
                out.append((_assemble(self.obs, query, cont), target))
            else:
                out.append(([], list(ids)))
        return out

    # -- arithmetic -----------------------------------------------------------------------
    def solution_ids(self, solution: str) -> list[int]:
        """A solution as the pioneer writes it after ``Answer:`` (leading space)."""
        return self.tok.encode(" " + solution, add_special_tokens=False)

    def _arithmetic(self, n: int, seed: int, split: str) -> list[tuple[list[int], list[int]]]:
        rng = random.Random(f"lm-arithmetic:{seed}")
        out = []
        for p in arithmetic_corpus.arithmetic_problems(n, seed, split):
            q = self.tok.encode(p["question"], add_special_tokens=False)
            answer = self.solution_ids(p["solution"])
            if rng.random() < self.mix["observer"]:
                right = rng.random() < self.mix["right_reference"]
                ref = p["solution"] if right else arithmetic_corpus.wrong_solution(rng, p)
                ref_ids = self.solution_ids(ref)[: self.max_new]  # as long as the env allows
                out.append((_assemble(self.obs, q, ref_ids), answer))
            else:
                out.append((_assemble(self.pio, q), answer))
        return out

    def sequences(self, n: int, seed: int, heldout: bool = False) -> Sequences:
        """``n`` training (or held-out) sequences, each ending with EOS."""
        if self.name == "sentiment":
            pairs = self._sentiment(n, seed)
        else:
            pairs = self._arithmetic(n, seed, "test" if heldout else "train")
        return Sequences([p + r + [self.eos] for p, r in pairs], [len(p) for p, _ in pairs])


def batches(seqs: list[list[int]], batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """``steps`` batches of sequence indices: epochs of shuffled, length-bucketed batches."""
    seqs = seqs.ids if isinstance(seqs, Sequences) else seqs
    rng = random.Random(seed)
    out: list[list[int]] = []
    while len(out) < steps:
        order = list(range(len(seqs)))
        rng.shuffle(order)
        chunk = batch_size * 32  # sort within chunks so each batch has similar lengths
        epoch = []
        for i in range(0, len(order) - batch_size + 1, chunk):
            part = sorted(order[i:i + chunk], key=lambda j: len(seqs[j]))
            epoch += [part[b:b + batch_size] for b in range(0, len(part) - batch_size + 1,
                                                          batch_size)]
        rng.shuffle(epoch)
        out += epoch
    return out[:steps]


def pad_rows(seqs: Sequences, rows: Sequence[int], pad: int, prompt_weight: float = 1.0):
    """Right-padded (ids, mask, weights) of some rows (every sequence starts at position 0).

    ``weights[i, t]`` weighs the loss of predicting token t: ``prompt_weight`` inside the
    prompt, 1 in the response (and its EOS), 0 at position 0 and on padding.
    """
    width = max(len(seqs.ids[i]) for i in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    weights = torch.zeros((len(rows), width))
    for r, i in enumerate(rows):
        n, k = len(seqs.ids[i]), seqs.prompt_lens[i]
        ids[r, :n] = torch.tensor(seqs.ids[i])
        mask[r, :n] = 1
        weights[r, 1:n] = 1.0
        weights[r, 1:k] = prompt_weight
    return ids, mask, weights
