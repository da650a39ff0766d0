"""Who sits in each role of the text view: a function from a prompt string to an answer string
per role (`Policy`), loaded from `module:name` specs, with seeded random answers for the rest.
The demo (`cory_env.demo`) and the OpenEnv service (`cory_env.openenv`) seat their players
here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from cory_common.plugins import load_plugin

from .core import role_names

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


def load_policy(spec: str) -> Policy:
    """The callable named by `module:name` or `path/to/file.py:name`."""
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name:
        raise ValueError(f"a policy is module:name or file.py:name, got {spec!r}")
    try:
        found = getattr(load_plugin(module), name, None)
    except ValueError as err:  # said as the policy it is, not as an --import
        raise ValueError(f"policy {spec!r}: " + str(err).replace(f"--import {module!r}",
                                                                f"module {module!r}")) from None
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
