"""`game`: two-player TextArena games as LLM-vs-LLM envs, one game move per turn.

    cory_env.env(task="game", rounds=5, reward_mode="individual")      # TicTacToe-v0-raw
    cory_env.env(task=cory_env.make_task("game", game="Nim-v0-raw"), rounds=3,
                 reward_mode="individual")

The agent at position 0 plays the game's player 0 (it moves first), position 1 player 1; with
`rotation=1` the two models exchange sides. Turn j of an episode is move j + 1 of the game. A
query is one seeded game; each turn's prompt is `{state}`: the player's own opening (the
game's rules and board) and, after its first move, what it has been shown since its last move
(the opponent's move and the new board), then the cue "Your next move, in brackets:" (with it
SmolLM2-135M's opening TicTacToe move is valid in 30 of 64 held-out games, without a cue in
5). The answer is sent to the game as the move (TextArena reads the bracketed move in it,
`[4]`).

One agent alone without an opponent (as the benchmark evaluates each model alone) makes the
opening move of a game and is paid its outcome so far: -1 when the move is invalid, else 0.

One side can be a fixed player instead of a model: `opponent=` names a rule ("first": the
first move the game lists as available, or else the first its rules quote; "last": the last)
or, in Python, is any function from
the player's observation text to a move. Then the env has one agent (`n_agents=1`), the game's
player 0, and each turn is its move followed by the opponent's reply; train it with `ppo`.

Rewards are the game's own outcome, paid at the end: +1 to the winner, -1 to the loser, 0 to
both in a draw or a game the env's rounds cut short. An invalid move loses the game at once
(TextArena's error allowance is set to 0), so the players strictly alternate and an episode
ends early when the game does. The games are zero-sum: under the collective reward every agent
is paid 0 (the env warns), so train them with `reward_mode="individual"`.

Games that run offline (no downloads) and alternate their two players move by move, in
TextArena 0.7.4: TicTacToe, ConnectFour, Nim, IteratedRockPaperScissors, IteratedMatchingPennies.
Others are refused by name: some start with player 1 or let a player move twice (KuhnPoker,
PigDice), some need NLTK corpora downloaded at run time (WordChains, DontSayIt), and some fail
to import on Python 3.11 (Chess, Checkers, IteratedStagHunt).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

import numpy as np

from cory_common.checks import check_int
from cory_common.pretrained import load_tokenizer

from .base import STATE, Query, Task, held_out, register_task
from .library import SEEDS, TEST_SHARE
from .textarena import TWO_PLAYER, check_textarena


def listed_moves(text: str) -> list[str]:
    """The moves an observation lists as available ('Available Moves: ...'), else those its
    rules quote ("'[rock]'"), in order."""
    found = re.findall(r"(?:Available Moves|Valid moves|available actions)[^\n]*", text)
    if found:
        return re.findall(r"\[[^\[\]]+\]", found[-1])
    return [m[1:-1] for m in re.findall(r"'\[[^\[\]']+\]'", text)]


def first_listed(text: str) -> str:
    """The opponent rule "first": the first move listed as available ('[?]' when none)."""
    moves = listed_moves(text)
    return moves[0] if moves else "[?]"


def last_listed(text: str) -> str:
    """The opponent rule "last": the last move listed as available ('[?]' when none)."""
    moves = listed_moves(text)
    return moves[-1] if moves else "[?]"


OPPONENTS = {"first": first_listed, "last": last_listed}
PROMPT = STATE + "\nYour next move, in brackets:"  # what the player was shown, then a cue


def observation_text(obs) -> str:
    """A TextArena observation (a string, or a list of (sender, message, kind)) as text."""
    return obs if isinstance(obs, str) else "\n".join(str(m[1]) for m in obs)


@functools.lru_cache(maxsize=65536)
def replay(game: str, seed: int, moves: tuple[str, ...], opponent: Callable | None = None
           ) -> tuple[bool, tuple, tuple]:
    """Play `moves` in the seeded game (each followed by `opponent`'s reply to it, when one
    plays player 1): (over, (reward of player 0, of player 1), what each player was shown:
    its opening and its latest observation, as texts)."""
    import textarena

    env = textarena.make(game)
    env.reset(num_players=2, seed=seed)
    env.state.error_allowance = 0  # an invalid move loses: the players strictly alternate
    shown: dict[int, list[str]] = {0: [], 1: []}
    over = False
    for move in moves:
        for who in ("agent", "opponent") if opponent else ("agent",):
            player, obs = env.get_observation()
            shown[player].append(observation_text(obs))
            over, _ = env.step(move if who == "agent" else opponent(shown[player][-1]))
            if over:
                break
        if over:
            break
    if not over:
        player, obs = env.get_observation()
        shown[player].append(observation_text(obs))
    rewards, _ = env.close()
    paid = (float(rewards.get(0, 0.0)), float(rewards.get(1, 0.0))) if over and rewards \
        else (0.0, 0.0)
    texts = tuple(s[0] if len(s) == 1 else f"{s[0]}\n{s[-1]}" if s else "" for s in
                  (shown[0], shown[1]))
    return over, paid, texts


@register_task("game")
class GameTask(Task):
    """A two-player TextArena game, one move per turn (see the module docstring)."""

    name = "game"
    pioneer_template = observer_template = observer_template_no_kt = PROMPT
    takes_run_tokenizer = True
    zero_sum = True
    default_max_new_tokens = 8
    default_context_len = 512

    def __init__(self, game: str = "TicTacToe-v0-raw", n_queries: int = 2048,
                 tokenizer: str = "smollm2-135m", opponent: str | Callable | None = None):
        super().__init__()
        check_textarena()
        if game not in TWO_PLAYER:
            raise ValueError(f"game: {game!r} is not a two-player TextArena game that runs "
                             f"offline and alternates its players move by move; use one of "
                             f"{list(TWO_PLAYER)}")
        check_int("n_queries", n_queries, 1)
        if isinstance(opponent, str):
            if opponent not in OPPONENTS:
                raise ValueError(f"game: opponent {opponent!r} is not a rule of "
                                 f"{sorted(OPPONENTS)} (or, in Python, a function of the "
                                 f"observation text)")
            opponent = OPPONENTS[opponent]
        elif opponent is not None and not callable(opponent):
            raise ValueError(f"game: opponent must be a rule name or a function, got "
                             f"{opponent!r}")
        self.game, self.n_queries, self.tokenizer_name = game, n_queries, tokenizer
        self.opponent = opponent
        self.zero_sum = opponent is None  # one agent against a rule: its own outcome

    def build_tokenizer(self):
        """The tokenizer named by the `tokenizer` option (SmolLM2's by default)."""
        return load_tokenizer(self.tokenizer_name)

    def load_queries(self, split: str) -> list[Query]:
        """Seeded games: train and test draw from their own seeds, one game in 5 held out."""
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; use train or test")
        start, out = SEEDS[split], []
        for seed in range(start, start + self.n_queries * 2):
            text = f"{self.game} #{seed}"
            if held_out(text, TEST_SHARE) == (split == "test"):
                out.append(Query(text=text, meta={"seed": seed}))
            if len(out) == self.n_queries:
                break
        return out

    def round_template(self, turn: int, n_agents: int, knowledge_transfer: bool) -> str:
        """Every turn shows the game's state to the player to move."""
        players = 1 if self.opponent else 2
        if n_agents != players:
            raise ValueError(f"game {self.game!r} has {players} model player(s) here: "
                             f"n_agents must be {players}, got {n_agents}")
        return self.pioneer_template

    def templates(self, knowledge_transfer: bool, n_agents: int = 2, rounds: int = 1):
        """The game's state for every turn; two model players, or one against `opponent`."""
        if rounds > 1 or self.opponent:
            self.round_template(0, n_agents, knowledge_transfer)
        return super().templates(knowledge_transfer, n_agents, rounds)

    def _replay(self, query: Query, answers: Sequence[str]):
        return replay(self.game, int(query.meta["seed"]), tuple(answers), self.opponent)

    def state_text(self, query: Query, answers: Sequence[str], turn: int) -> str:
        """What the player to move has been shown: its opening, then its latest observation."""
        return self._replay(query, answers)[2][0 if self.opponent else turn % 2]

    def game_over(self, queries, answers):
        """Which games are over after the moves so far."""
        return np.array([self._replay(q, [a[i] for a in answers])[0]
                         for i, q in enumerate(queries)])

    def round_scores(self, queries, answers, n_agents: int, last: bool):
        """The game's outcome for each player once the episode ends; 0 before (one agent
        alone: `reward`, its opening move's)."""
        if n_agents == 1 and not self.opponent:
            return None
        out = np.zeros((2, len(queries)))
        if last:
            for i, q in enumerate(queries):
                out[:, i] = self._replay(q, [a[i] for a in answers])[1]
        return out[:n_agents]

    def reward(self, queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
        """One move alone: the outcome for player 0 of a game opened with it."""
        return np.array([self._replay(q, [r])[1][0] for q, r in zip(queries, responses)])
