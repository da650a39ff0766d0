"""CORY (Ma, Hu et al., NeurIPS 2024): one LLM duplicated into a sequential cooperative team.

All of CORY's own logic is here. The pioneer answers the query; the observer answers after
seeing the query and the pioneer's answer. Three mechanisms on top of independent PPO:

* knowledge transfer: the env builds the observer's prompt from the pioneer's tokens
  (`knowledge_transfer = True`, an env flag);
* collective reward: both agents are paid r(q, a_pio) + r(q, a_obs) (`reward_mode`, an env
  flag), each with its own per-token KL penalty to the frozen reference;
* role exchange: every T_REx iterations the two models swap roles (`rotation`: llm_1 is the
  pioneer when it is 1). It is the env's agent-order option, so no model is reloaded and each
  keeps its own optimizer, KL controller and score statistics; the official implementation
  loses all three by reloading.

With K > 2 agents (a chain: position k sees the answers of positions 0..k-1) role exchange
becomes a rotation: every T_REx iterations each model moves one position down the chain
(`rotation`), so over K blocks every model plays every position.

The update itself is IPPO's: each model runs PPO on its own turn. The paper's ablations switch
one mechanism off each.
"""

from __future__ import annotations

from .base import IPPO, register_learner


def rotation(iteration: int, t_rex: int, n_agents: int = 2) -> int:
    """CORY's role schedule: the order offset r (llm_r is the pioneer) of an iteration, one
    step further every t_rex iterations, mod K."""
    return (iteration // t_rex) % n_agents


def __getattr__(name: str):
    """Earlier spellings of the schedule (`role_rotation`, and K = 2's `pioneer_is_swapped`)."""
    if name == "role_rotation":
        return rotation
    if name == "pioneer_is_swapped":
        return lambda iteration, t_rex: rotation(iteration, t_rex, 2) == 1
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CoryStructure:
    """CORY's env structure for any multi-agent learner: mix it in before the learner class."""

    knowledge_transfer = True
    reward_mode = "collective"
    role_exchange = True

    def reset_options(self, iteration: int) -> dict:
        """The role schedule: rotate every cfg.t_rex iterations (if role_exchange)."""
        r = rotation(iteration, self.cfg.t_rex, self.n_agents) if self.role_exchange else 0
        return {**super().reset_options(iteration), "rotation": r}


@register_learner("cory")
class CORY(CoryStructure, IPPO):
    """IPPO with knowledge transfer, the collective reward and role exchange."""


@register_learner("cory-no-kt")
class CORYNoKnowledgeTransfer(CORY):
    """Ablation: the observer sees only the query."""

    knowledge_transfer = False


@register_learner("cory-no-re")
class CORYNoRoleExchange(CORY):
    """Ablation: llm_0 is always the pioneer."""

    role_exchange = False


@register_learner("cory-individual")
class CORYIndividual(CORY):
    """Ablation: each agent is paid its own task reward."""

    reward_mode = "individual"
