"""`revision`: the CORY prompts extended over rounds, each agent answering again.

    cory_env.env(task="revision", rounds=3)                  # on reviews
    cory_env.make_task("revision", base="reasoning", per_round=True)

Round 1 is CORY on the `base` task (`reviews` by default; `reasoning`, or any registered task
but the games): the pioneer answers
the query, the observer sees the pioneer's answer. In every later round each agent sees the
query and the others' latest answers through the task's own observer template (with K = 2: the
other agent's answer of the turn before) and answers again; without knowledge transfer, its
own previous answer. Queries, tokens and the reward are the task's. The reward is paid on the
final round's answers (`per_round=True`: every round's, at the end of that round).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .base import RESPONSE, Query, Task, make_task, register_task, response_slot


@register_task("revision")
class RevisionTask(Task):
    """A task's CORY prompts over rounds: every agent revises after the others' answers."""

    name = "revision"

    def __init__(self, base: str = "reviews", per_round: bool = False):
        super().__init__()
        if base in ("revision", "game"):
            raise ValueError(f"revision: base task {base!r} cannot be revised (a task whose "
                             f"answers are revised, such as 'reviews' or 'reasoning')")
        self.base = make_task(base)
        self.round_rewards = "each" if per_round else "final"
        for name in ("pioneer_template", "observer_template", "observer_template_no_kt",
                     "default_max_new_tokens", "default_context_len", "takes_run_tokenizer",
                     "exact_match", "offline_model"):
            setattr(self, name, getattr(self.base, name))

    def load_queries(self, split: str) -> list[Query]:
        """The task's queries."""
        return self.base.queries(split)

    def build_tokenizer(self):
        """The task's tokenizer."""
        return self.base.tokenizer

    def use_tokenizer(self, tokenizer) -> None:
        """The run's tokenizer, for the task too."""
        super().use_tokenizer(tokenizer)
        self.base.use_tokenizer(tokenizer)

    def query_ids(self, query: Query, tokenizer) -> list[int]:
        """The task's query ids."""
        return self.base.query_ids(query, tokenizer)

    def chain_template(self, position: int) -> str:
        """The task's chain template."""
        return self.base.chain_template(position)

    def round_template(self, turn: int, n_agents: int, knowledge_transfer: bool) -> str:
        """The observer template with the others' latest answers (the K - 1 turns before this
        one), or without knowledge transfer the agent's own previous answer."""
        seen = range(turn - n_agents + 2, turn + 1) if knowledge_transfer and n_agents > 1 \
            else [turn - n_agents + 1]
        return self.observer_template.replace(RESPONSE, "\n".join(map(response_slot, seen)))

    def reward(self, queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
        """The task's reward."""
        return self.base.reward(queries, responses)
