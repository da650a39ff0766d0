"""A model as a function from a prompt string to an answer string: the text env's policies.

    answer = text_policy(trainer.learner.policies["llm_0"], tokenizer)   # a policy in memory
    answer = checkpoint_policy("runs/x/ckpt/cory-seed0.pt", agent="llm_1")   # a saved learner's
    answer = pipeline_policy(transformers.pipeline("text-generation", model=folder))
    answer("colour of snow ?")   # -> "white"

(`checkpoint_policy` lives in `agents.training.restore`: it rebuilds the run.) Each is a
`Callable[[str], str]`, as `cory_env.text_env`, `cory_env.demo.evaluate` and any
rule written by hand. Answers are greedy unless a `SamplingConfig` is given, and stop at EOS
or `max_new_tokens`; sampled answers are drawn from the policy's own seeded generator, so a
sequence of calls is the same under one seed.
"""

from __future__ import annotations

import torch

from cory_env.config import load_tokenizer

from .rollout import decode
from .sampling import SamplingConfig

GREEDY = SamplingConfig(top_k=1)


class TextPolicy:
    """An `LLMPolicy` (or any policy with begin/sample/feed) answering prompt strings."""

    def __init__(self, policy, tokenizer, max_new_tokens: int = 32,
                 sampling: SamplingConfig | None = None, seed: int = 0):
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        self.policy, self.tokenizer = policy, tokenizer
        self.max_new_tokens, self.sampling = max_new_tokens, sampling or GREEDY
        self.generator = torch.Generator(policy.device).manual_seed(seed)

    def __call__(self, prompt: str) -> str:
        """The policy's answer to one prompt (EOS left out)."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        ids = self.tokenizer.encode(prompt, add_special_tokens=False) or \
            [self.tokenizer.eos_token_id]
        ids = torch.tensor([ids], device=self.policy.device)
        eos, tokens = self.tokenizer.eos_token_id, []

        def play(token):  # the answer so far; stop at EOS or the cap
            tokens.append(int(token[0]))
            done = tokens[-1] == eos or len(tokens) == self.max_new_tokens
            return None if done else torch.ones(1, dtype=torch.bool, device=ids.device)

        decode(self.policy, ids, torch.ones_like(ids), self.max_new_tokens, play,
               self.sampling, self.generator)
        return self.tokenizer.decode(tokens[:-1] if tokens[-1] == eos else tokens,
                                     skip_special_tokens=False)


def text_policy(policy, tokenizer, max_new_tokens: int = 32,
                sampling: SamplingConfig | None = None, seed: int = 0) -> TextPolicy:
    """A policy in memory (e.g. `trainer.learner.policies["llm_0"]`) as a str -> str function."""
    return TextPolicy(policy, load_tokenizer(tokenizer), max_new_tokens, sampling, seed)


def pipeline_policy(pipe, max_new_tokens: int = 32, **generate) -> callable:
    """A transformers text-generation pipeline as a str -> str function (greedy by default)."""
    generate = {"do_sample": False, **generate}

    def answer(prompt: str) -> str:
        out = pipe(prompt, max_new_tokens=max_new_tokens, return_full_text=False, **generate)
        return out[0]["generated_text"]

    return answer
