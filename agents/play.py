"""Watch a model play both roles: each query, the pioneer's answer, the observer's, rewards.

    python -m agents.play                                   # SmolLM2-135M on reviews
    python -m agents.play --task reasoning --episodes 6
    python -m agents.play --model path/to/folder_or.gguf --task sentiment

One batch of episodes of the batched env with the model as both agents (untrained: the same
weights), through the training rollout; nothing is trained or written.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

import torch

from cory_env import BatchedCoryEnv, registered_tasks
from cory_env.plugins import load_plugins
from cory_env.pretrained import PRETRAINED, check_model, model_source, resolve_model

from .policy import LLMPolicy
from .rollout import rollout

STUDY = ("python -m benchmarks.run --model smollm2-135m --tasks reviews "
         "--methods ppo,cory --quick        # the comparison on this model (docs/fidelity.md)")


def transcripts(model: str, task: str, episodes: int, max_new_tokens: int | None, seed: int,
                mixed_precision: str | None = "bf16") -> list[dict]:
    """One batch of episodes; per episode the query, both answers and both task rewards."""
    folder = resolve_model(model)
    torch.manual_seed(seed)
    policy = LLMPolicy.from_pretrained(folder, mixed_precision=mixed_precision)
    env = BatchedCoryEnv(batch_size=episodes, task=task, tokenizer=folder, split="test",
                         max_new_tokens=max_new_tokens, seed=seed)
    turns = rollout(env, {"llm_0": policy, "llm_1": policy},
                    generator=torch.Generator().manual_seed(seed))
    pioneer, observer = turns["llm_0"], turns["llm_1"]
    queries = env.task.queries("test")
    return [{"query": queries[int(pioneer.query_index[i])].text,
             "pioneer": pioneer.texts[i], "observer": observer.texts[i],
             "pioneer_reward": float(pioneer.task_reward[i]),
             "observer_reward": float(observer.task_reward[i])} for i in range(episodes)]


def main(argv=None) -> int:
    """Print the transcripts of one batch of episodes."""
    p = argparse.ArgumentParser(prog="python -m agents.play", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m",
                   help=f"a short name ({', '.join(PRETRAINED)}), a .gguf file or a model folder")
    p.add_argument("--task", default="reviews")
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--import", dest="imports", action="append", default=[],
                   metavar="MODULE_OR_FILE", help="module or .py file that registers tasks")
    args = p.parse_args(argv)
    try:
        load_plugins(args.imports)
        check_model(args.model)
        if args.task not in registered_tasks():
            raise ValueError(f"unknown task {args.task!r}; registered: {registered_tasks()}")
        if args.episodes < 1:
            raise ValueError(f"--episodes must be positive, got {args.episodes}")
    except ValueError as err:
        p.error(str(err))
    source = model_source(resolve_model(args.model))
    print(f"{args.model} on {args.task}: the pioneer answers the query; the observer sees the "
          f"query and the pioneer's answer.")
    if source:
        print(f"({source['note']})")
    for i, ep in enumerate(transcripts(args.model, args.task, args.episodes,
                                       args.max_new_tokens, args.seed)):
        print(f"\n--- episode {i} ---\nquery:    {ep['query']!r}")
        for role in ("pioneer", "observer"):
            text = textwrap.shorten(repr(ep[role]), 110)
            print(f"{role + ':':<9} {text}  reward {ep[role + '_reward']:+.2f}")
    print(f"\nnext: {STUDY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
