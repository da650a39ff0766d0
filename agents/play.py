"""Watch a model play both roles: each query, the pioneer's answer, the observer's, rewards.

    python -m agents.play                                   # SmolLM2-135M on reviews
    python -m agents.play --task reasoning --episodes 6
    python -m agents.play --model path/to/folder_or.gguf --task sentiment
    python -m agents.play --task reasoning --alone 69 --samples 8   # the base model's score
    python -m agents.play --task game --rounds 5             # two copies play TicTacToe

One batch of episodes of the batched env with the model as both agents (untrained: the same
weights), through the training rollout; nothing is trained or written. With `--rounds R` each
agent answers R times, and every turn is shown with its round.
"""

from __future__ import annotations

import shlex
import sys
import textwrap
from dataclasses import dataclass, field

import torch

from cory_common import cli
from cory_common.checks import meta
from cory_common.cli import add_import_option
from cory_common.plugins import load_plugins
from cory_common.pretrained import PRETRAINED, check_model, model_source, resolve_model
from cory_common.threads import configure
from cory_env import BatchedCoryEnv, make_task, registered_tasks
from cory_env.tasks.base import unknown_task

from .llm.policy import LLMPolicy
from .llm.rollout import answer_alone, rollout
from .llm.sampling import SamplingConfig

STUDY = ("python -m benchmarks.run --model {model} --tasks {task} --methods ppo,cory "
         "--quick   # PPO vs CORY on this model")


def transcripts(model: str, task: str, episodes: int, max_new_tokens: int | None, seed: int,
                mixed_precision: str | None = "bf16", rounds: int = 1,
                task_options: dict | None = None) -> list[dict]:
    """One batch of episodes; per episode the query, both answers and both task rewards (the
    last round's), and with rounds every turn as (round, role, answer)."""
    folder = resolve_model(model)
    torch.manual_seed(seed)
    policy = LLMPolicy.from_pretrained(folder, mixed_precision=mixed_precision)
    task = make_task(task, **(task_options or {}))
    env = BatchedCoryEnv(batch_size=episodes, task=task, tokenizer=folder, split="test",
                         max_new_tokens=max_new_tokens, seed=seed, rounds=rounds,
                         reward_mode="individual" if task.zero_sum else "collective")
    turns = rollout(env, {"llm_0": policy, "llm_1": policy},
                    generator=torch.Generator().manual_seed(seed))
    pioneer, observer = turns["llm_0"], turns["llm_1"]
    queries = env.task.queries("test")
    out = []
    for i in range(episodes):
        said = [(r + 1, t.role, t.texts[r * episodes + i]) for r in range(pioneer.rounds)
                for t in (pioneer, observer) if r < t.rounds]
        last = [float(t.task_reward[(t.rounds - 1) * episodes + i]) for t in (pioneer, observer)]
        out.append({"query": queries[int(pioneer.query_index[i])].text,
                    "pioneer": said[-2][2], "observer": said[-1][2],
                    "pioneer_reward": last[0], "observer_reward": last[1], "turns": said})
    return out


def alone_score(model: str, task: str, n: int, samples: int, max_new_tokens: int | None,
                seed: int, mixed_precision: str | None = "bf16", **task_options) -> dict:
    """The untrained model answering the first n held-out queries alone, `samples` times each:
    its mean task reward and, with a temperature-1 sampler, pass@1 for exact-match tasks."""
    folder = resolve_model(model)
    policy = LLMPolicy.from_pretrained(folder, mixed_precision=mixed_precision)
    env = BatchedCoryEnv(batch_size=64, task=make_task(task, **task_options), tokenizer=folder,
                         split="test", n_agents=1, max_new_tokens=max_new_tokens,
                         seed=seed)
    pool = len(env.task.queries("test"))
    queries = list(range(min(n, pool)))
    rewards, _ = answer_alone(env, policy, SamplingConfig(), torch.Generator().manual_seed(seed),
                              [q for q in queries for _ in range(samples)], kl=False)
    return {"queries": len(queries), "held_out": pool, "samples": samples,
            "mean_reward": float(rewards.mean()), "exact_match": env.task.exact_match}


@dataclass
class PlayConfig:
    """What `python -m agents.play` plays: a model on a task, a few episodes or N alone."""

    model: str = field(default="smollm2-135m", metadata=meta(
        f"a short name ({', '.join(PRETRAINED)}), a .gguf file or a model folder"))
    task: str = field(default="reviews", metadata=meta("a registered task"))
    episodes: int = field(default=4, metadata=meta("episodes to print"))
    max_new_tokens: int | None = field(default=None, metadata=meta(
        "tokens per answer (none: the task's)"))
    seed: int = field(default=0, metadata=meta("seed of the queries and sampling"))
    threads: int = field(default=0, metadata=meta(
        "torch threads (0: torch's default, every core)"))
    rounds: int = field(default=1, metadata=meta("each agent answers R times"))
    alone: int = field(default=0, metadata=meta(
        "instead: score the first N held-out queries answered alone"))
    samples: int = field(default=1, metadata=meta("answers per query of --alone"))
    task_options: dict = field(default_factory=dict, metadata=meta(
        "the task's keywords, e.g. max_digits=2 (reasoning)"))

    def validate(self) -> PlayConfig:
        """Raise ValueError naming the bad option, before any model loads."""
        check_model(self.model)
        if self.task not in registered_tasks():
            raise ValueError(unknown_task(self.task))
        make_task(self.task, **self.task_options)  # its options, checked before loading
        if self.threads < 0:
            raise ValueError(f"--threads must be >= 0, got {self.threads}")
        for name in ("episodes", "samples", "max_new_tokens", "rounds"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
        return self


def main(argv=None) -> int:
    """Print the transcripts of one batch of episodes."""
    p = cli.Parser("python -m agents.play", description=__doc__)
    add_import_option(p)
    try:
        args, ns = cli.parse_into(p, PlayConfig, argv)
        load_plugins(ns.imports)
        args.validate()
    except (TypeError, ValueError) as err:
        p.error(str(err))
    print(f"[{configure(args.threads, restart=__name__ == '__main__')}]")
    if args.alone:
        r = alone_score(args.model, args.task, args.alone, args.samples, args.max_new_tokens,
                        args.seed, **args.task_options)
        what = "pass@1" if r["exact_match"] else "mean reward"
        print(f"{args.model} alone on {r['queries']} of {r['held_out']} held-out {args.task} "
              f"queries x {r['samples']} samples: {what} {r['mean_reward']:.3f}")
        return 0
    source = model_source(resolve_model(args.model))
    print(f"{args.model} on {args.task}: the pioneer answers the query; the observer sees the "
          f"query and the pioneer's answer.")
    if source:
        print(f"({source['note']})")
    for i, ep in enumerate(transcripts(args.model, args.task, args.episodes,
                                       args.max_new_tokens, args.seed, rounds=args.rounds,
                                       task_options=args.task_options)):
        print(f"\n--- episode {i} ---\nquery:    {ep['query']!r}")
        for rnd, role, said in ep["turns"][:-2]:  # earlier rounds: the answers alone
            print(f"{role + ':':<9} {textwrap.shorten(repr(said), 110)}  (round {rnd})")
        for role in ("pioneer", "observer"):
            text = textwrap.shorten(repr(ep[role]), 110)
            print(f"{role + ':':<9} {text}  reward {ep[role + '_reward']:+.2f}")
    print("\nnext: " + STUDY.format(model=shlex.quote(args.model), task=args.task))
    return 0


if __name__ == "__main__":
    sys.exit(main())
