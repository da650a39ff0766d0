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

import argparse
from collections.abc import Callable, Mapping

import numpy as np

from cory_common.plugins import load_plugin, load_plugins

from . import registered_tasks
from .core import role_names
from .tasks.base import unknown_task
from .text import copy_rate, text_env

Policy = Callable[[str], str]


def random_policy(tokenizer, max_new_tokens: int, seed: int = 0) -> Policy:
    """Answers of up to `max_new_tokens` uniformly random tokens (a seeded baseline)."""
    rng = np.random.default_rng(seed)

    def answer(prompt: str) -> str:
        ids = rng.integers(len(tokenizer), size=int(rng.integers(1, max_new_tokens + 1)))
        return tokenizer.decode(ids.tolist(), skip_special_tokens=True)

    return answer


def seat(game, policies: Mapping[str, Policy] | Policy | None, seed: int = 0
         ) -> dict[str, Policy]:
    """{role: function} for every role of a text env: the given ones (one function: all
    roles), random answers for the rest; a role the env does not have is a ValueError. A
    policy with `use_turn_cap(n)` is told the env's turn cap."""
    roles = role_names(game.unwrapped.tokens.max_num_agents)
    if callable(policies):
        policies = dict.fromkeys(roles, policies)
    policies = dict(policies or {})
    unknown = sorted(set(policies) - set(roles))
    if unknown:
        raise ValueError(f"no role {unknown} in this env; its roles are {list(roles)}")
    cap = game.unwrapped.tokens.max_new_tokens
    for policy in policies.values():  # a policy that asks is told the env's turn cap
        if callable(getattr(policy, "use_turn_cap", None)):
            policy.use_turn_cap(cap)
    fallback = random_policy(game.unwrapped.tokenizer, cap, seed)
    return {role: policies.get(role, fallback) for role in roles}


def play_role(policy: Policy, role: str, prompt) -> str:
    """The policy's answer; an error inside it says which role's policy raised it."""
    try:
        return policy(prompt)
    except Exception as err:
        raise RuntimeError(f"the {role}'s policy raised {type(err).__name__}: {err}") from err


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


def load_policy(spec: str) -> Policy:
    """The callable named by `module:name` or `path/to/file.py:name`."""
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name:
        raise ValueError(f"a policy is module:name or file.py:name, got {spec!r}")
    found = getattr(load_plugin(module), name, None)
    if not callable(found):
        raise ValueError(f"{spec!r}: {module} has no callable {name!r}")
    return found


def parse_policies(items, roles) -> dict[str, Policy]:
    """`--policy ROLE=SPEC` items as {role: function}, naming a bad item or role."""
    policies = {}
    for item in items:
        role, sep, spec = (x.strip() for x in item.partition("="))
        if not sep:
            raise ValueError(f"--policy takes ROLE=SPEC, got {item!r}")
        if role not in roles:
            raise ValueError(f"--policy {item!r}: no role {role!r}; the roles are {list(roles)}")
        policies[role] = load_policy(spec)
    return policies


def main(argv=None) -> dict:
    """Play a few episodes per task, print each transcript and the roles' scores."""
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="sentiment,arithmetic", help="comma list of tasks")
    p.add_argument("--episodes", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-agents", type=int, default=2, help="agents in the chain (K)")
    p.add_argument("--policy", action="append", default=[], metavar="ROLE=SPEC",
                   help="a str -> str function for a role, e.g. observer=mymod:answer")
    p.add_argument("--import", dest="imports", action="append", default=[],
                   metavar="MODULE_OR_FILE", help="module or .py file that registers tasks")
    args = p.parse_args(argv)
    try:
        load_plugins(args.imports)
        if args.n_agents < 2:
            raise ValueError(f"--n-agents must be at least 2, got {args.n_agents}")
        if args.episodes < 1:
            raise ValueError(f"--episodes must be at least 1, got {args.episodes}")
        # a policy's module may register the task it plays: import it before the check
        policies = parse_policies(args.policy, role_names(args.n_agents))
        for task in args.tasks.split(","):
            if task not in registered_tasks():
                raise ValueError(unknown_task(task))
    except ValueError as err:
        p.error(str(err))
    out = {}
    for task in args.tasks.split(","):
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
