"""The offline `arithmetic` task's synthetic corpus: word problems with their solutions, wrong
solutions, references and the one-shot prompt. Pure Python, seeded with ``random.Random``: the
same arguments give the same texts on any machine.
"""

import random
import zlib

from . import words as W

# ---------------------------------------------------------------------------------------------
# Arithmetic word problems
# ---------------------------------------------------------------------------------------------


def _add(rng: random.Random) -> dict:
    """Numbers for c = a + b."""
    a, b = rng.randint(2, 15), rng.randint(2, 15)
    return {"a": a, "b": b, "c": a + b}


def _sub(rng: random.Random) -> dict:
    """Numbers for c = a - b, never negative."""
    a = rng.randint(5, 25)
    b = rng.randint(1, a - 1)
    return {"a": a, "b": b, "c": a - b}


def _mul(rng: random.Random) -> dict:
    """Numbers for c = a * b."""
    a, b = rng.randint(2, 6), rng.randint(2, 8)
    return {"a": a, "b": b, "c": a * b}


def _mul_add(rng: random.Random) -> dict:
    """Numbers for c = a * b + d."""
    a, b, d = rng.randint(2, 5), rng.randint(2, 6), rng.randint(1, 12)
    return {"a": a, "b": b, "d": d, "m": a * b, "c": a * b + d}


def _add_sub(rng: random.Random) -> dict:
    """Numbers for c = a + b - d, never negative."""
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    d = rng.randint(1, a + b - 1)
    return {"a": a, "b": b, "d": d, "m": a + b, "c": a + b - d}


def _mul_sub(rng: random.Random) -> dict:
    """Numbers for c = a * b - d, never negative."""
    a, b = rng.randint(2, 5), rng.randint(2, 6)
    d = rng.randint(1, a * b - 1)
    return {"a": a, "b": b, "d": d, "m": a * b, "c": a * b - d}


def _add_add(rng: random.Random) -> dict:
    """Numbers for c = a + b + d."""
    a, b, d = rng.randint(1, 10), rng.randint(1, 10), rng.randint(1, 10)
    return {"a": a, "b": b, "d": d, "m": a + b, "c": a + b + d}


# (question, solution, number sampler). Every solution's last equation is "= {c}" and it ends
# with "The answer is {c}." so its final number is the answer.
_TEMPLATES = (
    ("{name} has {a} {obj}. {he} buys {b} more {obj}. How many {obj} does {name} have now?",
     "{name} has {a} {obj}. {he} buys {b} more, so {a} + {b} = {c}.", _add),
    ("{name} picked {a} {obj} in the morning and {b} {obj} in the afternoon. "
     "How many {obj} did {name} pick in total?",
     "{name} picked {a} {obj} and then {b} more, so {a} + {b} = {c}.", _add),
    ("{name} has {a} {obj} and {other} has {b} {obj}. How many {obj} do they have together?",
     "Together they have {a} + {b} = {c} {obj}.", _add),
    ("{name} had {a} {obj}. {he} gave {b} of them to {other}. "
     "How many {obj} does {name} have left?",
     "{name} had {a} {obj} and gave away {b}, so {a} - {b} = {c}.", _sub),
    ("There are {a} {obj} in a basket. {name} takes {b} of them. "
     "How many {obj} are in the basket now?",
     "There were {a} {obj} and {name} took {b}, so {a} - {b} = {c}.", _sub),
    ("{name} has {a} {obj} and {other} has {b} {obj}. "
     "How many more {obj} does {name} have than {other}?",
     "{name} has {a} and {other} has {b}, so {a} - {b} = {c}.", _sub),
    ("{name} has {a} {box} with {b} {obj} in each. How many {obj} does {name} have?",
     "{name} has {a} {box} of {b} {obj}, so {a} * {b} = {c}.", _mul),
    ("{name} buys {a} {obj} that cost {b} dollars each. How many dollars does {name} spend?",
     "Each one costs {b} dollars, so {a} * {b} = {c}.", _mul),
    ("A {box1} holds {b} {obj}. How many {obj} are in {a} {box}?",
     "Each {box1} holds {b} {obj}, so {a} * {b} = {c}.", _mul),
    ("{name} has {a} {box} with {b} {obj} in each and {d} more {obj} on the table. "
     "How many {obj} does {name} have in total?",
     "{name} has {a} * {b} = {m} {obj} in the {box}. Then {m} + {d} = {c}.", _mul_add),
    ("{name} has {a} {obj}. {he} buys {b} more and then gives {d} to {other}. "
     "How many {obj} does {name} have now?",
     "{name} has {a} + {b} = {m} {obj} after buying. Then {m} - {d} = {c}.", _add_sub),
    ("{name} buys {a} {box} of {obj} with {b} in each. {he} uses {d} of them. "
     "How many {obj} are left?",
     "{name} buys {a} * {b} = {m} {obj}. After using {d}, {m} - {d} = {c}.", _mul_sub),
    ("{name} has {a} {obj}, {other} has {b} {obj}, and their teacher gives them {d} more. "
     "How many {obj} do they have in total?",
     "They have {a} + {b} = {m} {obj}, and {m} + {d} = {c}.", _add_add),
)


def _render(template: tuple, ctx: dict, nums: dict) -> dict:
    """Fill one template with names/objects and numbers into a problem dict."""
    question, solution, _ = template
    values = {**ctx, **nums}
    return {
        "question": question.format(**values),
        "solution": solution.format(**values) + f" The answer is {nums['c']}.",
        "answer": str(nums["c"]),
    }


def _context(rng: random.Random) -> dict:
    """Random names, pronoun, object and container for one problem."""
    name, other = rng.sample(W.NAMES, 2)
    box = rng.choice(W.CONTAINERS)
    return {
        "name": name,
        "other": other,
        "he": "She" if name in W.SHE_NAMES else "He",
        "obj": rng.choice(W.OBJECTS),
        "box": box,
        "box1": box[:-2] if box.endswith("xes") else box[:-1],  # singular
    }


_ONE_SHOT = _render(
    _TEMPLATES[0],
    {"name": "Shawn", "other": "Mia", "he": "He", "obj": "toys", "box": "boxes", "box1": "box"},
    {"a": 5, "b": 4, "c": 9},
)
ARITH_ONE_SHOT = f"Question: {_ONE_SHOT['question']}\nAnswer: {_ONE_SHOT['solution']}\n"


def arith_split(question: str) -> str:
    """Route a question to "train" or "test" by a stable hash of its text."""
    return "test" if zlib.crc32(question.encode()) % 2 else "train"


def arithmetic_problems(n: int, seed: int, split: str = "train") -> list[dict]:
    """Return ``n`` distinct problems {question, solution, answer} from the given split."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng, seen, out = random.Random(seed), {_ONE_SHOT["question"]}, []
    while len(out) < n:
        template = rng.choice(_TEMPLATES)
        problem = _render(template, _context(rng), template[2](rng))
        if problem["question"] not in seen and arith_split(problem["question"]) == split:
            seen.add(problem["question"])
            out.append(problem)
    return out


def wrong_solution(rng: random.Random, problem: dict) -> str:
    """A plausible solution whose last step (and so its final answer) is wrong."""
    c = int(problem["answer"])
    w = c + rng.choice((-3, -2, -1, 1, 2, 3, 10))
    w = w if w >= 0 else c + 1
    body = problem["solution"].removesuffix(f" The answer is {c}.")
    head, tail = body.rsplit(f"= {c}", 1)
    return f"{head}= {w}{tail} The answer is {w}."


def arith_prompt(question: str, reference: str | None = None) -> str:
    """The pioneer prompt, or the observer prompt when a ``reference`` answer is given."""
    ref = "" if reference is None else f"Reference: {reference}\n"
    return f"{ARITH_ONE_SHOT}Question: {question}\n{ref}Answer:"


def arithmetic_references(n: int, seed: int) -> list[str]:
    """Return ``n`` observer strings: prompt with a right-or-wrong reference + correct answer."""
    rng = random.Random(f"references:{seed}")
    out = []
    for p in arithmetic_problems(n, seed, "train"):
        ref = p["solution"] if rng.random() < 0.5 else wrong_solution(rng, p)
        out.append(f"{arith_prompt(p['question'], ref)} {p['solution']}")
    return out
