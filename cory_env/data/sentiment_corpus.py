"""The offline `sentiment` task's synthetic corpus: movie reviews with their labels, the
observer-style positive rewrites, and the lexicon of the scorer's words. Pure Python, seeded
with ``random.Random``: the same arguments give the same texts on any machine.
"""

import random
import re

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
