"""Exercise 5 (solution): write a new task with its own reward.

`echo`: the query is a thing from the course vocabulary; the reward is 1 when the response
repeats that thing, 0.5 when it names the thing's colour, else 0.

Run: python -m examples.exercises.ex5_task
"""

from __future__ import annotations

import numpy as np

import cory_env
from cory_env import Query, Task, register_task
from cory_env.tasks.course import THINGS, course_tokenizer


@register_task("echo")
class EchoTask(Task):
    """Repeat the thing (1.0) or name its colour (0.5)."""

    name = "echo"
    pioneer_template = "{query} ?"
    observer_template = "{query} ? hint : {response}"
    default_max_new_tokens = 2
    default_context_len = 10

    def build_tokenizer(self):
        """Reuse the course task's 24-word tokenizer."""
        return course_tokenizer()

    def load_queries(self, split):
        """The eight things."""
        return [Query(text=t, answer=c) for t, c in THINGS.items()]

    def reward(self, queries, responses):
        """1.0 for the thing itself, 0.5 for its colour, else 0.0 (first word counts)."""
        out = []
        for q, r in zip(queries, responses):
            first = (r.split() or [""])[0]
            out.append(1.0 if first == q.text else 0.5 if first == q.answer else 0.0)
        return np.array(out, dtype=np.float32)


def main() -> float:
    """Play one scripted episode of the new task and print its transcript."""
    env = cory_env.env(task="echo", render_mode="ansi")
    env.reset(options={"queries": [0]})
    tok = env.unwrapped.tokenizer
    thing = env.unwrapped.task.queries()[0].text
    for word in (thing, "<eos>", "a", "<eos>"):
        env.step(tok.convert_tokens_to_ids(word))
    print(env.render())
    return env.unwrapped._cumulative_rewards["llm_0"]


if __name__ == "__main__":
    main()
