"""How a run's agents are arranged, as a value: a run is a learner on a structure.

A `Structure` is what the env is asked for (how many agents by default, whether a later agent
reads the earlier answers, whose reward each is paid) and the role schedule (whether the
models exchange positions every T_REx iterations). The learner (`agents.learners.registry`'s
registry: ppo, grpo, rloo, mappo, ...) turns the rollout into updates; it never decides the
structure.

    resolve_method("cory-grpo")        # Method(learner=GRPO, structure=cory)
    resolve_method("grpo/cory-no-kt")  # any learner on any named structure

A method name is either registered (every name of earlier versions: `cory`, `ippo`,
`cory-no-kt`, `cory-grpo`, the arms...) or spelt `learner/structure`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cory_env.config import REWARD_MODES


@dataclass(frozen=True)
class Structure:
    """The env structure a run trains on and its role schedule."""

    name: str
    n_agents: int = 2  # the default K (TrainConfig.n_agents sets a chain's K)
    knowledge_transfer: bool = False  # a later agent reads the earlier answers
    reward_mode: str = "individual"  # "collective": every agent is paid the sum of the rewards
    role_exchange: bool = False  # each model moves one position every t_rex iterations
    shared_policy: bool = False  # one model (one set of weights) plays every position
    # with a shared policy: its one update takes one model's optimizer steps (every position's
    # rows accumulated into each step), not K times as many
    matched_steps: bool = True

    def __post_init__(self) -> None:
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got "
                             f"{self.reward_mode!r}")
        if not (isinstance(self.n_agents, int) and self.n_agents >= 1):
            raise ValueError(f"n_agents must be a positive integer, got {self.n_agents!r}")

    def rotation(self, iteration: int, t_rex: int, n_agents: int) -> int:
        """The order offset r of an iteration (llm_r plays the first position): one step
        further every t_rex iterations, mod K, when roles are exchanged; else 0."""
        return (iteration // t_rex) % n_agents if self.role_exchange else 0

    def env_settings(self, n_agents: int) -> dict:
        """The env keywords of this structure for K agents."""
        return {"knowledge_transfer": self.knowledge_transfer, "reward_mode": self.reward_mode,
                "n_agents": n_agents}


SINGLE = Structure("single", n_agents=1)
INDEPENDENT = Structure("independent")

_STRUCTURES: dict[str, Structure] = {}


def register_structure(structure: Structure) -> Structure:
    """Make a structure available by name (for `learner/structure` method names)."""
    if _STRUCTURES.get(structure.name, structure) != structure:
        raise ValueError(f"a different structure is already registered as {structure.name!r}")
    _STRUCTURES[structure.name] = structure
    return structure


def structures() -> dict[str, Structure]:
    """The registered structures by name (built-in ones once `agents.learners.registry` registered
    them)."""
    return dict(_STRUCTURES)


register_structure(SINGLE)
register_structure(INDEPENDENT)
