"""A short offline rollout of the CORY env with printed transcripts (random token policies)."""

from __future__ import annotations

import argparse

import numpy as np

from . import env


def main(argv=None) -> None:
    """Play a few episodes per offline task and print each transcript."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tasks", default="sentiment,arithmetic")
    p.add_argument("--episodes", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    for task in args.tasks.split(","):
        game = env(task=task, render_mode="ansi", max_new_tokens=8)
        for episode in range(args.episodes):
            game.reset(seed=args.seed + episode, options={"swap_roles": bool(episode % 2)})
            for agent in game.agent_iter():
                _, reward, term, trunc, info = game.last()
                if term or trunc:
                    game.step(None)
                    continue
                game.step(int(rng.integers(game.action_space(agent).n)))
            print(f"--- {task}, episode {episode} ---")
            print(game.render())


if __name__ == "__main__":
    main()
