"""Play the CORY env in words: any function from a prompt string to an answer string can
take a role, and `evaluate` reports each role's reward and how often it copies the answer
before it.

    python -m cory_env.demo                                     # random answers, two tasks
    python -m cory_env.demo --tasks course --policy pioneer=examples.exercises.ex1_text:rule

    from cory_env.demo import evaluate
    evaluate({"pioneer": rule, "observer": model}, task="course", episodes=32)

A `--policy ROLE=SPEC` names a callable as `module:name` or `path/to/file.py:name`; roles are
`pioneer`, `observer` (K = 2) or `observer_1..` (K > 2), and a role without one answers with
random tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from cory_common import cli
from cory_common.checks import meta
from cory_common.cli import add_import_option
from cory_common.plugins import load_plugins
from cory_common.threads import configure

from . import registered_tasks
from .chain import copy_rate
from .core import role_names
from .seats import Policy, load_policy, parse_policies, play_role, seat
from .tasks.base import unknown_task
from .text import text_env


def evaluate(policies: Mapping[str, Policy] | Policy, episodes: int = 16, seed: int = 0,
             **config) -> dict:
    """Play `episodes` episodes of `text_env(**config)` with one function per role (or one for
    all); return {"roles": {role: {"reward", "copy_rate" (after the pioneer)}}, "episodes":
    per episode {role: {"prompt", "answer", "reward"}}}."""
    if not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes must be a positive integer, got {episodes!r}")
    if isinstance(policies, str):
        policies = load_policy(policies)
    elif isinstance(policies, Mapping):  # "module:name" specs load (and register) first
        policies = {role: load_policy(p) if isinstance(p, str) else p
                    for role, p in policies.items()}
    game = text_env(**config)
    seats = seat(game, policies, seed)
    roles = list(seats)
    played = []
    for episode in range(episodes):
        game.reset(seed=seed if episode == 0 else None)
        record = {}
        for _ in game.agent_iter():
            prompt, _, term, trunc, info = game.last()
            if term or trunc:
                record[info["role"]]["reward"] = info["task_reward"]
                record[info["role"]]["answer"] = info["response"]
                game.step(None)
                continue
            answer = play_role(seats[info["role"]], info["role"], prompt)
            if not isinstance(answer, str):
                raise TypeError(f"the {info['role']}'s policy returned {type(answer).__name__} "
                                f"({answer!r:.60}), not a str")
            record[info["role"]] = {"prompt": str(prompt)}
            game.step(answer)
        played.append(record)
    summary = {}
    for k, role in enumerate(roles):
        summary[role] = {"reward": float(np.mean([e[role]["reward"] for e in played]))}
        if k:
            summary[role]["copy_rate"] = copy_rate([e[roles[k - 1]]["answer"] for e in played],
                                                   [e[role]["answer"] for e in played])
    return {"roles": summary, "episodes": played}


@dataclass
class DemoConfig:
    """What `python -m cory_env.demo` plays: tasks, episodes and the roles' policies."""

    tasks: list[str] = field(default_factory=lambda: ["sentiment", "arithmetic"], metadata=meta(
        "comma list of tasks, each played in turn"))
    episodes: int = field(default=2, metadata=meta("episodes per task"))
    seed: int = field(default=0, metadata=meta("seed of the queries and random answers"))
    n_agents: int = field(default=2, metadata=meta("agents in the chain (K)"))
    policy: list[str] = field(default_factory=list, metadata=meta(
        "a str -> str function for a role, e.g. observer=mymod:answer (repeatable)"))

    def validate(self) -> DemoConfig:
        """Raise ValueError naming the bad option (a policy's module is imported here: it may
        register the task it plays)."""
        if self.n_agents < 2:
            raise ValueError(f"--n-agents must be at least 2, got {self.n_agents}")
        if self.episodes < 1:
            raise ValueError(f"--episodes must be at least 1, got {self.episodes}")
        self.policies()
        for task in self.tasks:
            if task not in registered_tasks():
                raise ValueError(unknown_task(task))
        return self

    def policies(self) -> dict[str, Policy]:
        """The --policy functions by role (their modules imported)."""
        return parse_policies(self.policy, role_names(self.n_agents))


def main(argv=None) -> dict:
    """Play a few episodes per task, print each transcript and the roles' scores."""
    p = cli.Parser("python -m cory_env.demo", description=__doc__)
    add_import_option(p)
    try:
        args, ns = cli.parse_into(p, DemoConfig, argv, special={"policy": {
            "action": "append", "metavar": "ROLE=SPEC"}})
        load_plugins(ns.imports)
        args.validate()
    except ValueError as err:
        p.error(str(err))
    configure(restart=__name__ == "__main__")
    policies = args.policies()
    out = {}
    for task in args.tasks:
        try:
            result = evaluate(policies, episodes=args.episodes, seed=args.seed, task=task,
                              n_agents=args.n_agents)
        except (TypeError, ValueError, RuntimeError) as err:  # a policy's fault: one line
            p.exit(2, f"{p.prog}: error: {task}: {err}\n")
        for i, episode in enumerate(result["episodes"]):
            print(f"--- {task}, episode {i} ---")
            for role, turn in episode.items():
                print(f"[{role}] {turn['prompt']!r} -> {turn['answer']!r}  "
                      f"r={turn['reward']:+.3f}")
        scores = ", ".join(f"{role} {s['reward']:+.3f}" + (f" (copies {s['copy_rate']:.0%})"
                                                           if "copy_rate" in s else "")
                           for role, s in result["roles"].items())
        print(f"=== {task}: mean reward {scores}")
        out[task] = result
    return out


if __name__ == "__main__":
    main()
