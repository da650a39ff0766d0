"""A short offline rollout of the CORY env with printed transcripts (random token policies)."""

from __future__ import annotations

import argparse

import numpy as np

from . import env, registered_tasks
from .plugins import load_plugins


def main(argv=None) -> None:
    """Play a few episodes per offline task and print each transcript."""
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    p.add_argument("--tasks", default="sentiment,arithmetic", help="comma list of tasks")
    p.add_argument("--episodes", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-agents", type=int, default=2, help="agents in the chain (K)")
    p.add_argument("--import", dest="imports", action="append", default=[],
                   metavar="MODULE_OR_FILE", help="module or .py file that registers tasks")
    args = p.parse_args(argv)
    try:
        load_plugins(args.imports)
        unknown = sorted(set(args.tasks.split(",")) - set(registered_tasks()))
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; registered: {registered_tasks()}")
        if args.n_agents < 2:
            raise ValueError(f"--n-agents must be at least 2, got {args.n_agents}")
    except ValueError as err:
        p.error(str(err))
    rng = np.random.default_rng(args.seed)
    for task in args.tasks.split(","):
        game = env(task=task, render_mode="ansi", max_new_tokens=8, n_agents=args.n_agents)
        for episode in range(args.episodes):  # the order rotates from episode to episode
            game.reset(seed=args.seed + episode, options={"rotation": episode})
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
