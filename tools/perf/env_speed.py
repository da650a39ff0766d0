"""The env's own cost: AEC steps per second, and the batched env's step against a decode step.

    python tools/perf/env_speed.py --model runs/perf-ref-model            # K = 2
    python tools/perf/env_speed.py --chain-agents 2,3,4,8 --threads 2     # chains, + LoRA memory

Prints one JSON line. For chains it also runs `child.py --lora-team K` for each K (the memory
of K LoRA adapters on one base, each in its own process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from child import run_json
from workload import ROOT, ReferenceWorkload, context_len, zero_reward


def aec_steps_per_s(task_name: str, n_steps: int, seed: int = 0) -> float:
    """AEC env steps per second with random tokens, reward computation excluded."""
    import cory_env

    task = zero_reward(cory_env.make_task(task_name))
    env = cory_env.env(task=task)
    actions = np.random.default_rng(seed).integers(env.action_space("llm_0").n, size=4096)

    def play(n: int) -> float:
        steps = 0
        env.reset(seed=seed)
        t0 = time.perf_counter()
        while steps < n:
            for _agent in env.agent_iter():
                _, _, term, trunc, _ = env.last()
                env.step(None if term or trunc else int(actions[steps % 4096]))
                steps += 1
            env.reset()
        return steps / (time.perf_counter() - t0)

    play(min(2000, n_steps))
    return statistics.median(play(n_steps) for _ in range(3))


class _Timed:
    """A proxy that adds the seconds spent in some of an object's methods to `self.seconds`."""

    def __init__(self, obj, methods: tuple[str, ...]):
        self.obj, self.methods = obj, methods
        self.seconds = dict.fromkeys(methods, 0.0)
        self.calls = dict.fromkeys(methods, 0)

    def __getattr__(self, name):
        value = getattr(self.obj, name)
        if name not in self.methods:
            return value

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = value(*args, **kwargs)
            self.seconds[name] += time.perf_counter() - t0
            self.calls[name] += 1
            return out
        return timed


def batched_env_overhead(model: str, rounds: int, batch: int = 64, resp: int = 16,
                         n_agents: int = 2) -> dict:
    """Time env.step vs. the policy's decode step (sample + cached forward) inside rollouts
    of a chain of `n_agents` (the context fitted to the chain's longest prompt beyond K = 2)."""
    import torch

    from agents.llm.policy import LLMPolicy
    from agents.llm.rollout import play_turn
    from agents.llm.sampling import SamplingConfig
    from cory_env import BatchedCoryEnv

    policy = LLMPolicy.from_pretrained(model, reference=None)
    env = BatchedCoryEnv(batch_size=batch, task=zero_reward(ReferenceWorkload(model)),
                         tokenizer=model, max_new_tokens=resp, n_agents=n_agents, seed=0,
                         context_len=context_len(resp) if n_agents == 2 else None)
    sampling, gen = SamplingConfig(repetition_penalty=1.1), torch.Generator().manual_seed(0)
    for round_ in range(rounds + 1):
        if round_ == 1:  # round 0 was a warm-up
            timed_env, timed_policy = _Timed(env, ("step",)), _Timed(policy, ("sample", "feed"))
        env.reset()
        while not env.finished:
            play_turn(timed_env if round_ else env, timed_policy if round_ else policy,
                      sampling, gen)
    env_step = timed_env.seconds["step"] / timed_env.calls["step"]
    forward = timed_policy.seconds["feed"] / timed_policy.calls["feed"]
    decode_step = forward + timed_policy.seconds["sample"] / timed_env.calls["step"]
    return {"env_step_ms": round(1e3 * env_step, 3), "forward_ms": round(1e3 * forward, 3),
            "decode_step_ms": round(1e3 * decode_step, 3),
            "frac_of_step": round(env_step / decode_step, 4),
            "frac_of_forward": round(env_step / forward, 4), "n_agents": n_agents,
            "context_len": env.episodes.L}


def chain_costs(model: str, agents: list[int], rounds: int, timeout: float) -> dict:
    """Per chain length K: the batched env's cost per decode step and a LoRA team's memory."""
    env = {k: batched_env_overhead(model, rounds, n_agents=k) for k in agents}
    child = str(Path(__file__).with_name("child.py"))
    memory = {k: run_json([sys.executable, child, "--lora-team", str(k), "--model", model],
                          f"LoRA team K={k}", timeout) for k in agents}
    return {"batched_env_overhead": env, "lora_team_memory": memory}


def main(argv=None) -> None:
    """Time the env (and chains) and print one JSON line."""
    import torch

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "runs" / "perf-ref-model"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--env-steps", type=int, default=20000, help="AEC steps per timing")
    p.add_argument("--env-rounds", type=int, default=4, help="batched-env rollouts timed")
    p.add_argument("--chain-agents", type=lambda s: [int(k) for k in s.split(",")],
                   default=None, help="chain lengths K (comma list): chain costs only")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.chain_agents:
        print(json.dumps(chain_costs(args.model, args.chain_agents, args.env_rounds,
                                     args.timeout)))
        return
    aec = {t: round(aec_steps_per_s(t, args.env_steps)) for t in ("sentiment", "arithmetic")}
    print(json.dumps({"aec_steps_per_s": aec,
                      "batched_env_overhead": batched_env_overhead(args.model, args.env_rounds)}))


if __name__ == "__main__":
    main()
