"""`textarena`: TextArena's single-turn games as CORY tasks (offline, from the game's seed).

    cory_env.make_task("textarena")                                   # ThreeCardMonte-v0-raw
    cory_env.make_task("textarena", game="ThreeCardMonte-v0-raw", n_queries=512)

A problem is one seeded game: its opening observation (the game's prompt and messages, one
per line) is the question, and an answer is the move the game reads (`[k]`). The reward is the
game's own: 1 when the answer's first line wins the game in that one move, 0 when it loses,
is refused as invalid, or leaves the game unfinished. Splits, prompts and the observer's
"Reference:" line are the library adapter's (`library.py`); there are no solved examples
(`shots` is 0: a game does not reveal its winning move), and the game's prompt states the
move format.

Games that work offline are single-player and end after one move; in TextArena 0.7.4 that is
ThreeCardMonte (track a ball under shuffled cups). Its multi-turn games (Sudoku, Mastermind,
2048, ...) are refused, and its word games (Wordle, Hangman, WordLadder) need NLTK corpora
downloaded at run time. Two-player games (TicTacToe, Nim, ...) are the task `game`
(`games.py`), played over the env's rounds.
"""

from __future__ import annotations

import importlib.util

from .base import Query, register_task
from .library import LibraryTask

SINGLE_TURN = ("ThreeCardMonte-v0-raw", "ThreeCardMonte-v0")
# run offline and alternate their two players move by move (the task `game`, games.py)
TWO_PLAYER = ("TicTacToe-v0-raw", "ConnectFour-v0-raw", "Nim-v0-raw",
              "IteratedRockPaperScissors-v0-raw", "IteratedMatchingPennies-v0-raw")


def check_textarena() -> None:
    """A ValueError with the install command when textarena is missing."""
    if importlib.util.find_spec("textarena") is None:
        raise ValueError("the textarena task needs the textarena package: "
                         "pip install 'cory[libraries]' (or pip install textarena)")


def opening(game) -> str:
    """A reset game's first observation as text (its messages, one per line)."""
    _, obs = game.get_observation()
    return obs if isinstance(obs, str) else "\n".join(str(m[1]) for m in obs)


@register_task("textarena")
class TextArenaTask(LibraryTask):
    """One single-turn TextArena game through the library adapter (`library.LibraryTask`)."""

    name = "textarena"
    default_max_new_tokens = 8
    default_context_len = 256

    def __init__(self, game: str = "ThreeCardMonte-v0-raw", n_queries: int = 2048,
                 tokenizer: str = "smollm2-135m"):
        check_textarena()
        import textarena

        known = textarena.envs.registration.ENV_REGISTRY
        if game not in known:
            raise ValueError(f"textarena: unknown game {game!r}; single-turn games that work "
                             f"offline: {list(SINGLE_TURN)}")
        if game.removesuffix("-raw") + "-raw" in TWO_PLAYER:
            raise ValueError(f"textarena: {game!r} is a two-player game: play it over rounds "
                             f"with task 'game' (make_task('game', game="
                             f"{game.removesuffix('-raw') + '-raw'!r}), env rounds=R)")
        if game not in SINGLE_TURN:
            raise ValueError(f"textarena: game {game!r} is not a single-turn game (its episodes "
                             f"need more than one move); use one of {list(SINGLE_TURN)}")
        super().__init__(n_queries, 0, tokenizer)
        self.game = game

    def _reset(self, seed: int):
        import textarena

        game = textarena.make(self.game)
        game.reset(num_players=1, seed=seed)
        return game

    def draw(self, seed: int, size: int) -> list[Query]:
        """The opening observations of games seed .. seed + size - 1 (answers unknown)."""
        return [Query(text=opening(self._reset(seed + i)), meta={"seed": seed + i})
                for i in range(size)]

    def solved(self, query: Query, answer: str) -> bool:
        """Replay the game from its seed, play the answer: did it win in that move?"""
        game = self._reset(query.meta["seed"])
        opening(game)
        done, _ = game.step(answer)
        rewards, _ = game.close()
        return bool(done) and rewards is not None and rewards.get(0, 0.0) >= 1.0
