"""The text env as an OpenEnv environment: an OpenEnv client plays a role over HTTP/WebSocket.

    python -m cory_env.openenv --task course --role observer --port 8000 \\
        --policy pioneer=examples.exercises.ex1_text:rule

    from openenv.core import GenericEnvClient          # the client, anywhere
    with GenericEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(seed=0)             # result.observation["prompt"], ["role"]
        result = env.step({"answer": "white"}) # ... until result.done; result.reward

The server holds `cory_env.text_env(**config)`. The client plays `role` (every role in turn
when none is given): each observation is the prompt of the role that acts next, and the
server answers for the other roles with their functions (`--policy ROLE=module:name`; random
tokens for a role without one). When the episode ends the observation is done, its reward
is the client's role's (the team's, r_pio + r_obs, under the collective reward), and it
holds every role's task reward and answer. With rounds, each observation's reward is what the
client's role was paid since its last answer (a task that pays every round pays mid-episode).
`state` is the episode's transcript.
Each WebSocket connection gets its own env; OpenEnv's HTTP reset/step are one-shot calls, each on
a fresh env (a step there is refused with 409, since no episode was started on that env).
It runs as a service (`cory_env.service`): at most `--max-connections` connections at once, each
bad frame answered by name with the connection kept, idle connections closed after
`--idle-timeout` seconds, one log line per connection, and a clean exit on SIGTERM.
Needs `pip install 'cory[openenv]'`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cory_common import cli

try:
    from fastapi.responses import JSONResponse
    from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
except ModuleNotFoundError as err:  # an optional extra
    raise ModuleNotFoundError(f"cory_env.openenv needs openenv-core ({err}): "
                              f"pip install 'cory[openenv]'") from None

from cory_common.checks import meta
from cory_common.cli import add_import_option
from cory_common.plugins import load_plugins
from cory_common.threads import configure

from .core import role_names
from .seats import Policy, parse_policies, play_role, seat
from .service import Connections, check_port, serve
from .text import text_env


class OutOfOrder(RuntimeError):
    """A step with no episode running (before reset, or after the episode ended)."""


class CoryAction(Action):
    """The acting role's answer."""

    answer: str


class CoryObservation(Observation):
    """The prompt of the role that acts next (empty once the episode is done)."""

    prompt: str = ""
    agent: str = ""
    role: str = ""
    task_rewards: dict[str, float] = {}  # once done: every role's task reward
    answers: dict[str, str] = {}  # once done: every role's answer as the env kept it


class CoryState(State):
    """The episode so far: every position's prompt and answer, in acting order."""

    transcript: str = ""


class CoryOpenEnv(Environment):
    """CORY's text env behind OpenEnv's reset/step/state (see the module docstring)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, role: str | None = None, policies: Mapping[str, Policy] | None = None,
                 **config):
        super().__init__()
        self.game = text_env(**config)
        self.seats = seat(self.game, policies)  # the hosted roles' functions
        if role is not None and role not in self.seats:
            raise ValueError(f"no role {role!r} in this env; its roles are {list(self.seats)}")
        self.role = role
        self._state, self._started = CoryState(), False

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              options: dict | None = None, **kwargs: Any) -> CoryObservation:
        """Start an episode (the text env's seed and reset options); play up to the client."""
        self.game.reset(seed=seed, options=options)
        self._state, self._started = CoryState(episode_id=episode_id, step_count=0), True
        return self._advance()

    def step(self, action: CoryAction, timeout_s: float | None = None,
             **kwargs: Any) -> CoryObservation:
        """Play the client's answer, then the hosted roles, up to the client's next turn."""
        if not self._started:
            raise OutOfOrder("step before reset: call reset() first")
        if self._done():
            raise OutOfOrder("the episode is over: reset() first")
        if not isinstance(getattr(action, "answer", None), str):
            raise ValueError(f"the action's field 'answer' must be a str, got {action!r:.80}")
        self.game.step(action.answer)
        self._state.step_count += 1
        return self._advance()

    @property
    def state(self) -> CoryState:
        """The episode id, the client's steps and the transcript so far."""
        if self._started:
            self._state.transcript = str(self.game.unwrapped.state())
        return self._state

    def _done(self) -> bool:
        env = self.game.unwrapped
        return all(env.terminations.get(a, True) or env.truncations.get(a, False)
                   for a in env.possible_agents)

    def _advance(self) -> CoryObservation:
        env = self.game.unwrapped
        while not self._done():
            agent = env.agent_selection
            role = env.infos[agent]["role"]
            if self.role is None or role == self.role:  # with rounds: what was paid since
                paid = float(env._cumulative_rewards[agent]) if env.config.rounds > 1 else None
                return CoryObservation(prompt=str(env.observe(agent)), agent=agent, role=role,
                                       reward=paid)
            self.game.step(play_role(self.seats[role], role, str(env.observe(agent))))
        infos = {a: env.infos[a] for a in env.possible_agents}
        mine = next((a for a, i in infos.items() if i["role"] == (self.role or "pioneer")))
        return CoryObservation(
            done=True, reward=float(env.rewards[mine]),
            task_rewards={i["role"]: i["task_reward"] for i in infos.values()},
            answers={i["role"]: i["response"] for i in infos.values()})


def app(role: str | None = None, policies: Mapping[str, Policy] | None = None,
        max_connections: int = 8, idle_s: float = 300.0, **config) -> Connections:
    """The ASGI app serving a fresh `CoryOpenEnv(role, policies, **config)` per connection."""
    Connections.check(max_connections, idle_s)  # bad settings fail here, before serving
    CoryOpenEnv(role, policies, **config)
    inner = create_fastapi_app(lambda: CoryOpenEnv(role, policies, **config), CoryAction,
                               CoryObservation, max_concurrent_envs=max_connections)
    inner.add_exception_handler(OutOfOrder, lambda _, err: JSONResponse(
        {"detail": f"{err}; HTTP /reset and /step are one-shot calls, each on a fresh env: "
                   f"play an episode over the WebSocket /ws, as OpenEnv's clients do"}, 409))
    for bad_value in (ValueError, TypeError):
        inner.add_exception_handler(bad_value, lambda _, err: JSONResponse({"detail": str(err)},
                                                                           422))
    return Connections(inner, CoryAction, max_connections=max_connections, idle_s=idle_s)


@dataclass
class ServeConfig:
    """What `python -m cory_env.openenv` serves: one task's chain, the roles it hosts, where."""

    task: str = field(default="course", metadata=meta("the one task served"))
    role: str | None = field(default=None, metadata=meta(
        "the role the client plays (none: every role in turn)"))
    policy: list[str] = field(default_factory=list, metadata=meta(
        "a str -> str function for a hosted role, e.g. pioneer=mymod:answer (repeatable)"))
    n_agents: int = field(default=2, metadata=meta("agents in the chain, K"))
    rounds: int = field(default=1, metadata=meta("rounds: each agent answers R times"))
    host: str = field(default="127.0.0.1", metadata=meta("address to listen on"))
    port: int = field(default=8000, metadata=meta("port to listen on"))
    max_connections: int = field(default=8, metadata=meta("client connections at once"))
    idle_timeout: float = field(default=300.0, metadata=meta(
        "seconds after which a connection that sends nothing is closed"))


def main(argv=None) -> None:
    """Serve the text env on localhost for OpenEnv clients."""
    p = cli.Parser("python -m cory_env.openenv", description=__doc__)
    add_import_option(p)
    try:
        args, ns = cli.parse_into(p, ServeConfig, argv, special={"policy": {
            "action": "append", "metavar": "ROLE=SPEC"}})
        load_plugins(ns.imports)
        policies = parse_policies(args.policy, role_names(args.n_agents))
        server = app(args.role, policies, args.max_connections, args.idle_timeout,
                     task=args.task, n_agents=args.n_agents, rounds=args.rounds)
        check_port(args.host, args.port)
    except ValueError as err:
        p.error(str(err))
    configure(restart=__name__ == "__main__")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    hosted = ", ".join(f"{r}={'given' if r in policies else 'random'}"
                       for r in role_names(args.n_agents) if r != args.role)
    print(f"cory_env.openenv: task {args.task!r}, the client plays "
          f"{args.role or 'every role in turn'}" + (f"; hosted: {hosted}" if args.role else "")
          + f"; at most {args.max_connections} connections, idle ones closed after "
          f"{args.idle_timeout:g} s; ws://{args.host}:{args.port}/ws", flush=True)
    serve(server, args.host, args.port)


if __name__ == "__main__":
    main()
