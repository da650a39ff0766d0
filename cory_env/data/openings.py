"""Movie-review openings for the `reviews` task: a few thousand distinct first sentences.

Written from a small grammar (openers x films x people x years), not sampled: the same on
every machine. Like the first words of IMDB reviews they name films, people, years and
genres, and lean positive, negative or neither. `review_openings()` returns them deduplicated
and shuffled under a fixed seed; the task cuts each to its first 2-8 tokens.
"""

from __future__ import annotations

import itertools
import random

GENRES = ("horror", "comedy", "western", "war", "science fiction", "romance", "crime",
          "animated", "musical", "thriller", "family", "sports", "martial arts", "noir",
          "disaster", "fantasy", "period", "teen", "zombie", "superhero", "spy", "heist")
NOUNS = ("River", "Night", "Garden", "Stranger", "Winter", "Kingdom", "Promise", "Shadow",
         "Island", "Letter", "Harbor", "Machine", "Storm", "Mirror", "Bridge", "Dragon",
         "Summer", "Widow", "Circus", "Desert")
ADJECTIVES = ("Last", "Silent", "Broken", "Golden", "Lost", "Hidden", "Red", "Endless",
              "Little", "Dark", "Second", "Wild")
FIRST = ("Tom", "Meryl", "Denzel", "Kate", "Robert", "Julia", "Sean", "Emma", "Jack", "Diane",
         "Cary", "Bette", "Michael", "Sigourney", "Burt", "Audrey", "Gene", "Olivia")
LAST = ("Hanks", "Stone", "Walsh", "Moreau", "Keaton", "Fuller", "Harlow", "Bergman", "Lang",
        "Crawford", "Tracy", "Dunne", "Kelly", "Newman", "Hepburn", "Reed")
PLACES = ("Paris", "Texas", "a small town", "New York", "the desert", "London", "space",
          "Tokyo", "a prison", "the suburbs", "Berlin", "the jungle")
RELATIVES = ("wife", "husband", "son", "daughter", "brother", "sister", "friends", "kids",
             "girlfriend", "dad", "mom")
WATCHED = ("watched", "rented", "saw", "caught", "bought", "recorded", "streamed")
WHEN = ("last night", "yesterday", "on cable", "at a festival", "on a plane", "as a kid",
        "this weekend", "in the theater", "on DVD", "for the second time")

# {t}: a title, {n}: a person, {g}: a genre, {y}: a year, {p}: a place, {r}: a relative,
# {w}: a verb of watching, {when}: an occasion
PATTERNS = (
    "{t} is a {g} film", "{t} is one of the best {g} movies", "{t} is a mess",
    "{t} was released in {y}", "{t} tells the story of", "{t} is not a good movie",
    "I {w} {t} {when}", "I {w} this movie {when}", "My {r} and I {w} {t}",
    "We {w} {t} {when}", "{n} plays a", "{n} stars as", "{n} gives the performance of",
    "{n} is wasted in", "{n}'s new {g} film", "{n} directed this {g} film",
    "In {y}, {n} made", "Made in {y}, this {g} film", "Set in {p}, this {g} film",
    "Set in {p} in {y},", "This {g} film about", "This {g} movie from {y}",
    "This is the worst {g} film", "This is the best {g} film", "This {g} movie was",
    "The {g} genre has", "The plot of {t}", "The acting in {t}", "The ending of {t}",
    "The first half of {t}", "The script for {t}", "The music in {t}",
    "The cast of {t}", "The director of {t}", "When {t} came out in {y}",
    "When I first saw {t}", "Having read the book, I", "After seeing {t} {when},",
    "Going into {t}, I", "If you like {g} films,", "Fans of {n} will",
    "Of all the {g} films of {y},", "What a {g} film", "Where do I begin with {t}",
    "Let me start by saying {t}", "I have never seen a {g} film", "I grew up watching {n}",
    "I expected more from {n}", "I really wanted to like {t}", "I did not expect {t}",
    "Why did {n} agree to", "How {t} got made", "Nobody in {t}", "Everyone in {t}",
    "Only {n} could", "Unlike most {g} films,", "Like most {g} films from {y},",
    "Years after {t},", "Twenty years on, {t}", "Back in {y}, {n}", "Not since {y} has",
    "A {g} film set in {p}", "A remake of {t}", "A sequel to {t}", "An adaptation of {t}",
)
YEARS = tuple(str(y) for y in range(1931, 2020, 4))


def _titles() -> list[str]:
    """Film titles: 'The River', 'The Last Storm', 'River Night', ..."""
    out = [f"The {n}" for n in NOUNS]
    out += [f"The {a} {n}" for a, n in itertools.product(ADJECTIVES, NOUNS)]
    out += [f"{a} {n}" for a, n in itertools.product(NOUNS, NOUNS) if a != n][:120]
    return out


def review_openings(seed: int = 0, per_pattern: int = 80) -> list[str]:
    """Distinct review openings (at most `per_pattern` per pattern), shuffled under `seed`."""
    rng = random.Random(seed)
    titles = _titles()
    names = [f"{f} {s}" for f, s in itertools.product(FIRST, LAST)]
    seen, out = set(), []
    for pattern in PATTERNS:
        kept = 0
        for _ in range(per_pattern * 3):
            text = pattern.format(t=rng.choice(titles), n=rng.choice(names),
                                  g=rng.choice(GENRES), y=rng.choice(YEARS),
                                  p=rng.choice(PLACES), r=rng.choice(RELATIVES),
                                  w=rng.choice(WATCHED), when=rng.choice(WHEN))
            text = text[0].upper() + text[1:]
            if text not in seen:
                seen.add(text)
                out.append(text)
                kept += 1
            if kept == per_pattern:
                break
    rng.shuffle(out)
    return out
