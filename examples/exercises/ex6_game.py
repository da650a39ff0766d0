"""Exercise 6 (solution): a two-player game played by two functions, then one side trained.

Run: python -m examples.exercises.ex6_game     (SmolLM2-135M plays; docs/exercises.md says how long)

First two rules play TicTacToe against each other in the text env (`task="game"`, five
rounds: one move per turn, the game's own outcome as the reward): `first` plays the first move
the board lists, `centre` the centre when it is free, else a free corner, else the first. Then
one side is a model: it plays the game's player 0 against the `first` rule (the task option
`opponent="first"`: one agent, each of its moves answered by the rule) and is trained with PPO
for a few iterations; its mean outcome per iteration is printed. TicTacToe has no chance, so
two rules play the same game from every seed; a model samples, so its games differ.
"""

from __future__ import annotations

import time

import cory_env
from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.training.config import TrainConfig
from agents.training.train import Trainer
from cory_common import cli
from cory_common.checks import check_int
from cory_common.threads import configure
from cory_env.tasks.games import listed_moves


def first(prompt: str) -> str:
    """The first move the board lists as available."""
    moves = listed_moves(prompt)
    return moves[0] if moves else "[0]"


def centre(prompt: str) -> str:
    """The centre when it is free, else a free corner, else the first listed move."""
    moves = listed_moves(prompt)
    for best in ("[4]", "[0]", "[2]", "[6]", "[8]"):
        if best in moves:
            return best
    return first(prompt)


def play(pioneer, observer, games: int) -> dict[str, float]:
    """Play `games` seeded TicTacToe games, pioneer as player 0; each side's mean outcome."""
    env = cory_env.text_env(task="game", rounds=5, reward_mode="individual")
    players = {"llm_0": pioneer, "llm_1": observer}
    totals = {"llm_0": 0.0, "llm_1": 0.0}
    for seed in range(games):
        env.reset(seed=seed)
        for agent in env.agent_iter():
            prompt, reward, term, trunc, _ = env.last()
            if term or trunc:
                totals[agent] += reward
                env.step(None)
                continue
            env.step(players[agent](prompt))
    return {agent: total / games for agent, total in totals.items()}


def config(model: str, iterations: int, batch: int, seed: int = 0) -> TrainConfig:
    """The training of player 0 against the `first` rule (checked: a bad value is named)."""
    ppo = PPOConfig(mini_batch_size=batch, lr=1e-5,
                    kl=KLConfig(coef=0.05, penalty="kl", scale_horizon=False))
    return TrainConfig(task="game", task_options={"opponent": "first"}, method="ppo",
                       model=model, rounds=5, max_new_tokens=4, iterations=iterations,
                       batch_size=batch, seed=seed, ppo=ppo).validate()


def train(cfg: TrainConfig) -> list[float]:
    """PPO for player 0 against the `first` rule; the mean outcome of each iteration, printed
    as it comes."""
    print(f"loading {cfg.model} and training player 0 for {cfg.iterations} iterations of "
          f"{cfg.batch_size} games...", flush=True)
    curve, start = [], time.perf_counter()
    for m in Trainer(cfg).run():
        curve.append(m["llm_0"]["task_reward"])
        print(f"  iteration {m['iteration']}: mean outcome {curve[-1]:+.2f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    return curve


def main(argv=None) -> dict:
    """Rules against rules, then a model trained against a rule; print and return both."""
    p = cli.Parser("python -m examples.exercises.ex6_game", description=__doc__)
    p.add_argument("--games", type=int, default=20, help="games of each rule pairing")
    p.add_argument("--model", default="smollm2-135m", help="the model that learns player 0")
    p.add_argument("--iterations", type=int, default=3, help="PPO iterations (default: 3)")
    p.add_argument("--batch", type=int, default=8, help="games per iteration (default: 8)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: every core)")
    args = p.parse_args(argv)
    try:  # every value checked before the first game is played
        for flag, low in (("games", 1), ("iterations", 1), ("batch", 1), ("threads", 0)):
            check_int(f"--{flag}", getattr(args, flag), low)
        cfg = config(args.model, args.iterations, args.batch)
    except ValueError as err:
        p.error(str(err))
    configure(args.threads, restart=__name__ == "__main__")
    rules = {"first -> first": (first, first), "centre -> first": (centre, first),
             "first -> centre": (first, centre)}
    results = {name: play(a, b, args.games) for name, (a, b) in rules.items()}
    for name, outcome in results.items():
        print(f"{name:16s} player 0 {outcome['llm_0']:+.2f}  player 1 {outcome['llm_1']:+.2f}")
    curve = train(cfg)
    print("model (player 0) against `first`, mean outcome per iteration:",
          " ".join(f"{x:+.2f}" for x in curve))
    return {"rules": results, "trained": curve}


if __name__ == "__main__":
    main()
