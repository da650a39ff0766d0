"""Exercise 1 (solution): a policy as a function from a prompt string to an answer string.

Run: python -m examples.exercises.ex1_text

Rules first: `rule` reads the thing in its prompt and names its colour twice (the most a
`colours` answer can earn); `copycat` repeats the hint, the pioneer's answer, that its
prompt shows. Then a model: the course LM, trained as CORY for a few iterations, answers
through `agents.llm.text.text_policy`. Every pair plays the text env with
`cory_env.demo.evaluate`, which reports each role's reward and how often the observer copies.
"""

from __future__ import annotations

import tempfile

from agents.llm.text import text_policy
from agents.training.train import Trainer
from cory_common import cli
from cory_env.demo import evaluate
from cory_env.tasks.course import THINGS

from .common import course_config, course_lm


def rule(prompt: str) -> str:
    """The colour of the thing asked about, twice ("colour of snow ?" -> "white white")."""
    words = prompt.split()
    colour = THINGS.get(words[words.index("of") + 1], "the") if "of" in words[:-1] else "the"
    return f"{colour} {colour}"


def copycat(prompt: str) -> str:
    """The hint the prompt shows (the pioneer's answer), word for word; "the" without one."""
    return prompt.split("hint :", 1)[1].strip() if "hint :" in prompt else "the"


def main(argv=None) -> dict:
    """Play rules, an untrained and a trained course LM in both roles; print and return the
    mean reward and copy rate of each pairing."""
    p = cli.Parser("python -m examples.exercises.ex1_text", description=__doc__)
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--episodes", type=int, default=32)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="course-lm-") as tmp:
        trainer = Trainer(course_config("cory", course_lm(tmp), args.iterations))
        tokenizer = trainer.env.tokenizer
        untrained = text_policy(trainer.learner.policies["llm_0"], tokenizer)
        pairs = {"rule -> copycat": (rule, copycat)}
        pairs["untrained -> copycat"] = (untrained, copycat)
        results = {name: evaluate({"pioneer": p, "observer": o}, episodes=args.episodes,
                                  task="colours") for name, (p, o) in pairs.items()}
        for _ in trainer.run():
            pass
        trained = text_policy(trainer.learner.policies["llm_0"], tokenizer)
        for name, (pio, obs) in {"trained -> copycat": (trained, copycat),
                                 "rule -> trained": (rule, trained)}.items():
            results[name] = evaluate({"pioneer": pio, "observer": obs}, episodes=args.episodes,
                                     task="colours")
    for name, result in results.items():
        roles = result["roles"]
        print(f"{name:22s} pioneer {roles['pioneer']['reward']:.2f}  observer "
              f"{roles['observer']['reward']:.2f}  copies {roles['observer']['copy_rate']:.0%}")
    return {name: result["roles"] for name, result in results.items()}


if __name__ == "__main__":
    main()
