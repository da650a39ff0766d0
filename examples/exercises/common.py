"""Shared helpers for the exercises: a tiny LM for the `colours` task (registered by cory_env:
`cory_env.tasks.course.ColoursTask`) and a short config."""

from __future__ import annotations

import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from agents.learners.ppo_config import KLConfig, PPOConfig
from agents.training.config import TrainConfig
from cory_env.tasks.course import course_tokenizer


def course_lm(folder: str) -> str:
    """Write a tiny random GPT-2 with the course tokenizer into folder (once); return it."""
    if not os.path.exists(os.path.join(folder, "config.json")):
        tok = course_tokenizer()
        tok.save_pretrained(folder)
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(tok), n_positions=32,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
        GPT2LMHeadModel(cfg).save_pretrained(folder)
    return folder


def course_config(method: str, model: str, iterations: int = 8, seed: int = 0) -> TrainConfig:
    """A fast training config on the colours task (seconds on a laptop CPU)."""
    ppo = PPOConfig(mini_batch_size=8, lr=1e-2,
                    kl=KLConfig(coef=0.02, penalty="kl", scale_horizon=False))
    return TrainConfig(task="colours", method=method, model=model, iterations=iterations,
                       batch_size=16, seed=seed, t_rex=3, ppo=ppo)


def main(argv=None) -> None:
    """python -m examples.exercises.common DIR: write the course LM into DIR."""
    from cory_common import cli

    p = cli.Parser("python -m examples.exercises.common",
                   description="Write the exercises' tiny course LM into a folder (once).")
    p.add_argument("folder", help="where the model goes, e.g. runs/course-lm")
    print(course_lm(p.parse_args(argv).folder))


if __name__ == "__main__":
    main()
