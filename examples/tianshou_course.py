"""Train the `course` task with Tianshou 2.0.1 PPO on the team reward, in well under a minute.

    PYTHONPATH=. python examples/tianshou_course.py --seed 0 --epochs 4

The last line printed is `random=<mean team reward> trained=<mean team reward>`, both over the
same evaluation episodes (every course query in turn, fixed seeds). A perfect pair scores 2.0.
"""

from __future__ import annotations

import argparse
import os
import time

from cory_common import cli

# Tianshou JIT-compiles a few buffer helpers with numba on first use, which costs more time
# than this whole run spends in them; the pure-Python versions give identical results.
os.environ.setdefault("NUMBA_DISABLE_JIT", "1")

import torch  # noqa: E402

from agents.interop.tianshou import train_course  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options."""
    parser = cli.Parser("python -m examples.tianshou_course", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (one is fastest for this tiny network)")
    parser.add_argument("--no-knowledge-transfer", action="store_true",
                        help="the observer does not see the pioneer's answer")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    """Train, print per-role results, and end with the random-vs-trained line."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    result = train_course(seed=args.seed, epochs=args.epochs,
                          knowledge_transfer=not args.no_knowledge_transfer)
    for name in ("random", "trained"):
        roles = result[f"{name}_roles"]
        print(f"{name:>7}: team {result[name]:.3f}  pioneer {roles['pioneer']:.3f}  "
              f"observer {roles['observer']:.3f}")
    print(f"trained {result['env_steps']} env steps in {result['seconds']:.1f}s "
          f"(total {time.perf_counter() - start:.1f}s)")
    print(f"random={result['random']:.4f} trained={result['trained']:.4f}")
    return result


if __name__ == "__main__":
    main()
