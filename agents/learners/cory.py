"""CORY (Ma, Hu et al., NeurIPS 2024): one LLM duplicated into a sequential cooperative team.

All of CORY's own logic is here. The pioneer answers the query; the observer answers after
seeing the query and the pioneer's answer. Three mechanisms on top of independent PPO:

* knowledge transfer: the env builds the observer's prompt from the pioneer's tokens
  (`knowledge_transfer=True`, an env flag);
* collective reward: both agents are paid r(q, a_pio) + r(q, a_obs) (`reward_mode`, an env
  flag), each with its own per-token KL penalty to the frozen reference;
* role exchange: every T_REx iterations the two models swap roles (`rotation`: llm_1 is the
  pioneer when it is 1). It is the env's agent-order option, so no model is reloaded and each
  keeps its own optimizer, KL controller and score statistics; the official implementation
  loses all three by reloading.

With K > 2 agents (a chain: position k sees the answers of positions 0..k-1) role exchange
becomes a rotation: every T_REx iterations each model moves one position down the chain
(`rotation`), so over K blocks every model plays every position.

The structure is a value (`agents.learners.structure.Structure`): any learner runs on it
(`cory-grpo` is GRPO on it, `grpo/cory-no-kt` GRPO on an ablation). CORY itself is PPO on it:
each model runs PPO on its own turn. The paper's ablations switch one mechanism off each.
"""

from __future__ import annotations

from dataclasses import replace

from .registry import register_method
from .structure import Structure, register_structure

# knowledge transfer, the collective reward and role exchange; K = 2 by default
CORY = register_structure(Structure("cory", n_agents=2, knowledge_transfer=True,
                                    reward_mode="collective", role_exchange=True))
# The paper's ablations, one mechanism off each
CORY_NO_KT = register_structure(replace(CORY, name="cory-no-kt", knowledge_transfer=False))
CORY_NO_RE = register_structure(replace(CORY, name="cory-no-re", role_exchange=False))
CORY_INDIVIDUAL = register_structure(replace(CORY, name="cory-individual",
                                             reward_mode="individual"))
# One policy for both roles: one model plays pioneer and observer and learns from both turns
# of every episode (no role exchange: there is one model), in as many optimizer steps as one
# PPO model takes (each step accumulates both roles' rows); `cory-shared-more-steps` takes a
# step per mini-batch of the stacked turns, K times as many
CORY_SHARED = register_structure(replace(CORY, name="cory-shared", role_exchange=False,
                                         shared_policy=True))
CORY_SHARED_MORE_STEPS = register_structure(replace(CORY_SHARED, name="cory-shared-more-steps",
                                                    matched_steps=False))


def rotation(iteration: int, t_rex: int, n_agents: int = 2) -> int:
    """CORY's role schedule: the order offset r (llm_r is the pioneer) of an iteration, one
    step further every t_rex iterations, mod K."""
    return CORY.rotation(iteration, t_rex, n_agents)


# CORY is PPO on CORY's structure, and its ablations likewise (each other learner's module
# registers it on CORY's structure: `cory-grpo`, `cory-rloo`, ...).
register_method("cory", "ppo", CORY)
register_method("cory-no-kt", "ppo", CORY_NO_KT, ablates="knowledge transfer")
register_method("cory-no-re", "ppo", CORY_NO_RE, ablates="role exchange")
register_method("cory-individual", "ppo", CORY_INDIVIDUAL)
register_method("cory-shared", "ppo", CORY_SHARED)
register_method("cory-shared-more-steps", "ppo", CORY_SHARED_MORE_STEPS)
