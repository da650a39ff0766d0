"""Exercise 4 (solution): switch knowledge transfer and role exchange off and on.

With knowledge transfer the observer can copy a good pioneer answer instead of moving its own
policy far from the reference, so its KL stays lower; role exchange makes both models spend
time as the observer. Turning either off removes that and KL tends to rise (the paper's
ablations, Sec. 4.3). At this toy scale the effect is noisy: compare several seeds.

Run: python -m examples.exercises.ex4_structure
"""

from __future__ import annotations

import tempfile

from agents.training.train import Trainer
from cory_common import cli

from .common import course_config, course_lm


def main(argv=None) -> dict[str, dict]:
    """Train cory and its two ablations; print each model's final reward and KL."""
    p = cli.Parser("python -m examples.exercises.ex4_structure", description=__doc__)
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    tmp = tempfile.TemporaryDirectory(prefix="course-lm-")
    model = course_lm(tmp.name)
    out = {}
    for method in ("cory", "cory-no-kt", "cory-no-re"):
        history = list(Trainer(course_config(method, model, args.iterations, args.seed)).run())
        out[method] = history
        last = history[-1]
        print(f"{method:11s} " + "  ".join(
            f"{a}: r={last[a]['task_reward']:.2f} kl={last[a]['kl']:.2f} ({last[a]['role']})"
            for a in ("llm_0", "llm_1")))
    tmp.cleanup()
    return out


if __name__ == "__main__":
    main()
