"""Peak memory and time of one MAPPO step at the GSM8K preset's batch shape, scaled down.

    python tools/perf/critic_memory.py [--models DIR]

A 2-layer GPT-2 with Llama-2's 32,000-token vocabulary on the offline `arithmetic` task, batch
32, mini-batch 2 x 16 accumulation, one PPO epoch, full KL: the vocabulary and the pass sizes
are what decide the critic's memory (docs/learners.md, MAPPO). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_check import Shape, build_model  # noqa: E402  (this folder's GPU-check kit)

# the model of the measurement: vocabulary and pass sizes are what decide the critic's memory
SHAPE = Shape("critic-memory", "arithmetic", "gpt2",
              dict(n_layer=2, n_embd=64, n_head=2, vocab_size=32000, n_positions=512),
              batch_size=32, mini_batch_size=2, grad_accum_steps=16, max_new_tokens=40)


def main(argv=None) -> dict:
    """Run one MAPPO step; print and return peak RSS and the critic update's seconds."""
    import torch

    from agents.learners.ppo_config import PPOConfig
    from agents.training.config import TrainConfig
    from agents.training.train import Trainer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--models", default="runs/critic-memory",
                   help="folder the model is built into (once)")
    args = p.parse_args(argv)
    model = build_model(SHAPE, Path(args.models))
    torch.set_num_threads(2)
    ppo = PPOConfig(mini_batch_size=SHAPE.mini_batch_size,
                    grad_accum_steps=SHAPE.grad_accum_steps, ppo_epochs=1, kl_penalty="full")
    trainer = Trainer(TrainConfig(task=SHAPE.task, method="mappo", model=str(model),
                                  batch_size=SHAPE.batch_size, ppo=ppo, iterations=1))
    learner, seconds = trainer.learner, {}
    update_critic = learner.update_critic

    def timed(*a):
        t0 = time.perf_counter()
        out = update_critic(*a)
        seconds["critic_update_s"] = round(time.perf_counter() - t0, 3)
        return out

    learner.update_critic = timed
    m = trainer.step()
    result = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
              "update_s": round(m["time_update_s"], 3), **seconds}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
