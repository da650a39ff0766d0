"""Deterministic synthetic corpora for the offline sentiment and arithmetic tasks.

Everything here is pure Python and seeded with ``random.Random``, so the same arguments
always give the same texts, on any machine.
"""

import random
import re
import zlib

from . import words as W

REWRITE_TEMPLATE = 'I can make this sentence "{text}" more positive: {query}'
_NEGATED = ("not", "not at all", "far from", "never", "hardly")
_JOINERS = {"not", "never", "hardly", "far", "from", "at", "all", "a", "an", "the", *W.INTENSIFIERS}
_AFTER_NEGATION = {"not", "never", "hardly", "from", "all"}
_LONG_POSITIVE = [w for w in W.POSITIVE if len(w) >= 6]
_LONG_NEGATIVE = [w for w in W.NEGATIVE if len(w) >= 6]


# ---------------------------------------------------------------------------------------------
# Sentiment reviews
# ---------------------------------------------------------------------------------------------


def sentiment_lexicon() -> tuple[set[str], set[str]]:
    """Return the (positive, negative) sentiment words used by the review generator."""
    return set(W.POSITIVE) | set(W.POSITIVE_EXTRA), set(W.NEGATIVE) | set(W.NEGATIVE_EXTRA)


def _a(word: str) -> str:
    """Prefix ``word`` with the right indefinite article."""
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _plural(noun: str) -> str:
    """Naive English plural, good enough for the film genres."""
    return noun[:-1] + "ies" if noun.endswith("y") else noun + "s"


def _adjective(rng: random.Random, positive: bool) -> str:
    """A single sentiment adjective of the given polarity."""
    return rng.choice(W.POSITIVE if positive else W.NEGATIVE)


def _adj_phrase(rng: random.Random, positive: bool) -> str:
    """An adjective phrase of the given polarity, sometimes a negated opposite ("not good")."""
    r = rng.random()
    if r < 0.15:
        return f"{rng.choice(_NEGATED)} {_adjective(rng, not positive)}"
    if r < 0.55:
        return f"{rng.choice(W.INTENSIFIERS)} {_adjective(rng, positive)}"
    if r < 0.7:
        return f"{_adjective(rng, positive)} and {_adjective(rng, positive)}"
    return _adjective(rng, positive)


def _aspect(rng: random.Random) -> tuple[str, str]:
    """A film aspect and a matching past-tense verb, e.g. ("plot", "was")."""
    if rng.random() < 0.3:
        return rng.choice(W.PLURAL_ASPECTS), "were"
    return rng.choice(W.ASPECTS), "was"


def _actor(rng: random.Random) -> str:
    """A fictional actor's full name."""
    return f"{rng.choice(W.FIRST_NAMES)} {rng.choice(W.LAST_NAMES)}"


def _opening(rng: random.Random, pos: bool) -> str:
    """First sentence of a review; its first words make a natural, neutral prompt."""
    film, adj, when = rng.choice(W.FILMS), _adj_phrase(rng, pos), rng.choice(W.WHEN)
    aspect, verb = _aspect(rng)
    word = rng.choice(_LONG_POSITIVE if pos else _LONG_NEGATIVE)
    templates = (
        lambda: f"This {film} was {adj}.",
        lambda: f"This {film} is {adj}.",
        lambda: f"I watched this {film} {when} and it was {adj}.",
        lambda: f"I saw this {film} {when}, and I found it {adj}.",
        lambda: f"The acting is {adj}.",
        lambda: f"The {aspect} {verb} {adj}.",
        lambda: f"The {aspect} in this {film} {verb} {adj}.",
        lambda: f"What {_a(_adjective(rng, pos))} {film}!",
        lambda: f"I have seen many {_plural(film)}, and this one is {adj}.",
        lambda: f"{_actor(rng)} is {adj} as the {rng.choice(W.ROLES)} in this {film}.",
        lambda: f"{rng.choice(W.FILLERS)}, this {film} was {adj}.",
        lambda: f"I rented this {film} {when} and it turned out to be {adj}.",
        lambda: f"From start to finish, this {film} is {adj}.",
        lambda: f"My {rng.choice(W.RELATIVES)} and I watched this {film} {when}, and it was {adj}.",
        lambda: f"This is one of the most {word} {_plural(film)} I have ever seen.",
    )
    return rng.choice(templates)()


def _middle(rng: random.Random, pos: bool) -> str:
    """A middle sentence about one or two aspects, all of the given polarity."""
    (aspect, verb), (aspect2, verb2) = _aspect(rng), _aspect(rng)
    adj = _adj_phrase(rng, pos)
    templates = (
        lambda: f"The {aspect} {verb} {adj}.",
        lambda: f"Even the {aspect} {verb} {adj}.",
        lambda: f"The {aspect} {verb} {adj}, and the {aspect2} {verb2} {_adj_phrase(rng, pos)}.",
        lambda: f"{rng.choice(W.FILLERS)}, the {aspect} {verb} {adj}.",
        lambda: f"{_actor(rng)} gives {_a(_adjective(rng, pos))} performance as the "
        f"{rng.choice(W.ROLES)}.",
        lambda: f"The director did {_a(_adjective(rng, pos))} job with the {aspect}.",
    )
    return rng.choice(templates)()


def _mixed(rng: random.Random, pos: bool) -> str:
    """A contrastive sentence: one aspect of the opposite polarity, then one of ``pos``."""
    (aspect, verb), (aspect2, verb2) = _aspect(rng), _aspect(rng)
    bad, good = _adj_phrase(rng, not pos), _adj_phrase(rng, pos)
    if rng.random() < 0.5:
        return f"The {aspect} {verb} {bad}, but the {aspect2} {verb2} {good}."
    return f"Although the {aspect} {verb} {bad}, the {aspect2} {verb2} {good}."


def _closing(rng: random.Random, pos: bool) -> str:
    """A verdict sentence of the given polarity."""
    word, film = rng.choice(_LONG_POSITIVE if pos else _LONG_NEGATIVE), rng.choice(W.FILMS)
    if pos:
        templates = (
            lambda: f"I would {rng.choice(('', 'highly ', 'strongly '))}recommend it to "
            f"{rng.choice(W.AUDIENCES)}.",
            lambda: f"Overall, {_a(word)} {film}.",
            lambda: f"{rng.randint(7, 10)} out of 10.",
            lambda: "Definitely worth watching.",
            lambda: "I will watch it again.",
            lambda: "Do not miss it.",
            lambda: f"A real {rng.choice(('gem', 'treat', 'masterpiece', 'joy'))}.",
            lambda: "I loved every minute of it.",
        )
    else:
        templates = (
            lambda: f"I would not recommend it to {rng.choice(W.AUDIENCES)}.",
            lambda: f"Overall, {_a(word)} {film}.",
            lambda: f"{rng.randint(1, 4)} out of 10.",
            lambda: "Save your money.",
            lambda: "A complete waste of time.",
            lambda: "I want my two hours back.",
            lambda: "Avoid it at all costs.",
            lambda: "I turned it off after an hour.",
            lambda: f"What {rng.choice(('a mess', 'a disaster', 'a failure'))}.",
            lambda: "I hated every minute of it.",
        )
    return rng.choice(templates)()


def _review(rng: random.Random, label: int) -> str:
    """One review of 1-3 sentences and 15-40 words whose overall sentiment is ``label``."""
    pos = bool(label)
    while True:
        parts, kind = [_opening(rng, pos)], rng.random()
        if kind < 0.35:
            parts.append(_mixed(rng, pos))
        elif kind < 0.75:
            parts.append(_middle(rng, pos))
        elif kind < 0.85:
            parts.append(_middle(rng, not pos))
        contrast = 0.75 <= kind < 0.85
        if contrast or rng.random() < 0.6:
            parts.append(_closing(rng, pos))
        text = " ".join(parts)
        if 15 <= len(text.split()) <= 40:
            return text


def sentiment_reviews(n: int, seed: int) -> list[tuple[str, int]]:
    """Return ``n`` (review, label) pairs, label 1 positive / 0 negative, roughly balanced."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = int(rng.random() < 0.5)
        out.append((_review(rng, label), label))
    return out


# ---------------------------------------------------------------------------------------------
# Observer-style rewrites
# ---------------------------------------------------------------------------------------------

_POSITIVE_ALT = "|".join(sorted(set(W.POSITIVE) | set(W.POSITIVE_EXTRA), key=len, reverse=True))
# A negator directly before a positive word (at most one word in between): "not very good".
_NEGATED_POSITIVE = re.compile(
    rf"\b(?:not at all|far from|not|never|hardly) (?=(?:\w+ )?(?:{_POSITIVE_ALT})\b)",
    re.IGNORECASE,
)
_PHRASES = (
    (re.compile(r"\b[1-4] out of 10"), "9 out of 10"),
    (re.compile(r"\bwaste of time"), "joy to watch"),
    (re.compile(r"\b[Ss]ave your money"), "See it soon"),
    (re.compile(r"\bturned it off after an hour"), "watched it twice in a row"),
    (re.compile(r"\bwant my two hours back"), "want to see it again"),
)
_NEGATIVE_WORDS = set(W.NEGATIVE) | set(W.NEGATIVE_EXTRA)
_SENTIMENT_WORDS = _NEGATIVE_WORDS | set(W.POSITIVE) | set(W.POSITIVE_EXTRA)


def _bare(word: str) -> str:
    """Lower-case ``word`` without surrounding punctuation."""
    return word.strip(".,!?;:\"'").lower()


def _replace_word(rng: random.Random, word: str) -> str:
    """Swap a negative word for a positive one, keeping punctuation and capitalisation."""
    core = _bare(word)
    new = W.ANTONYMS.get(core) or rng.choice(W.POSITIVE)
    if word[:1].isupper():
        new = new.capitalize()
    start = word.lower().index(core)
    return word[:start] + new + word[start + len(core):]


def positivise(text: str, rng: random.Random) -> str:
    """Make ``text`` more positive: drop negations of positive words, swap negative words."""
    text = _NEGATED_POSITIVE.sub("", text)
    for pattern, repl in _PHRASES:
        text = pattern.sub(repl, text)
    tokens = text.split(" ")
    for i, tok in enumerate(tokens):
        prev = _bare(tokens[i - 1]) if i else ""
        if _bare(tok) in _NEGATIVE_WORDS and prev not in _AFTER_NEGATION:
            tokens[i] = _replace_word(rng, tok)
    return " ".join(tokens)


def _rewrite(rng: random.Random, review: str) -> str:
    """Cut ``review`` into query + continuation and format an observer training string."""
    words = review.split(" ")
    k = rng.randint(2, 5)
    while k < len(words) - 1 and _bare(words[k - 1]) in _JOINERS:
        k += 1
    end = min(len(words), k + rng.randint(3, 10))
    while end < len(words) and not any(_bare(w) in _SENTIMENT_WORDS for w in words[k:end]):
        end += 1  # reach at least one sentiment word, so there is something to improve
    while end < len(words) and _bare(words[end - 1]) in _JOINERS:
        end += 1
    query, continuation = " ".join(words[:k]), " " + " ".join(words[k:end])
    prompt = REWRITE_TEMPLATE.format(text=query + continuation, query=query)
    return prompt + positivise(continuation, rng)


def sentiment_rewrites(n: int, seed: int) -> list[str]:
    """Return ``n`` observer strings 'I can make this sentence "..." more positive: ...'."""
    rng = random.Random(seed)
    return [_rewrite(rng, _review(rng, int(rng.random() < 0.5))) for _ in range(n)]


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
