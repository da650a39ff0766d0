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

from cory_common.pretrained import load_tokenizer

from .loading import config_positions
from .rollout import decode
from .sampling import SamplingConfig

GREEDY = SamplingConfig(top_k=1)


class TextPolicy:
    """An `LLMPolicy` (or any policy with begin/sample/feed) answering prompt strings.

    `max_new_tokens` None: the cap of the text env that seats it (`use_turn_cap`, which
    `cory_env.seats.seat` calls), else DEFAULT_CAP; never past the model's positions.
    """

    DEFAULT_CAP = 32

    def __init__(self, policy, tokenizer, max_new_tokens: int | None = None,
                 sampling: SamplingConfig | None = None, seed: int = 0):
        if max_new_tokens is not None and (not isinstance(max_new_tokens, int)
                                           or isinstance(max_new_tokens, bool)
                                           or max_new_tokens < 1):
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        self.policy, self.tokenizer = policy, tokenizer
        self.max_new_tokens, self.sampling = max_new_tokens, sampling or GREEDY
        self.turn_cap: int | None = None
        self.generator = torch.Generator(policy.device).manual_seed(seed)

    def use_turn_cap(self, cap: int) -> None:
        """Answer at most `cap` tokens when no max_new_tokens was given (the env's turn cap)."""
        self.turn_cap = int(cap)

    def positions(self) -> int | None:
        """The positions the policy's model allows (None: unknown)."""
        return config_positions(getattr(getattr(self.policy, "hf_model", None), "config", None))

    def __call__(self, prompt: str) -> str:
        """The policy's answer to one prompt (EOS left out)."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        ids = self.tokenizer.encode(prompt, add_special_tokens=False) or \
            [self.tokenizer.eos_token_id]
        cap = self.max_new_tokens or self.turn_cap or self.DEFAULT_CAP
        limit = self.positions()
        if limit is not None and len(ids) + cap > limit:
            if self.max_new_tokens is None and len(ids) < limit:
                cap = limit - len(ids)  # the default shrinks to what fits
            else:
                raise ValueError(f"a prompt of {len(ids)} tokens plus max_new_tokens={cap} "
                                 f"needs {len(ids) + cap} positions, but the model has {limit}: "
                                 f"lower max_new_tokens or shorten the prompt")
        ids = torch.tensor([ids], device=self.policy.device)
        eos, tokens = self.tokenizer.eos_token_id, []

        def play(token):  # the answer so far; stop at EOS or the cap
            tokens.append(int(token[0]))
            done = tokens[-1] == eos or len(tokens) == cap
            return None if done else torch.ones(1, dtype=torch.bool, device=ids.device)

        decode(self.policy, ids, torch.ones_like(ids), cap, play, self.sampling, self.generator)
        return self.tokenizer.decode(tokens[:-1] if tokens[-1] == eos else tokens,
                                     skip_special_tokens=False)


def text_policy(policy, tokenizer, max_new_tokens: int | None = None,
                sampling: SamplingConfig | None = None, seed: int = 0) -> TextPolicy:
    """A policy in memory (e.g. `trainer.learner.policies["llm_0"]`) as a str -> str function
    (`max_new_tokens` None: the turn cap of the text env that seats it)."""
    return TextPolicy(policy, load_tokenizer(tokenizer), max_new_tokens, sampling, seed)


def pipeline_policy(pipe, max_new_tokens: int = 32, **generate) -> callable:
    """A transformers text-generation pipeline as a str -> str function (greedy by default)."""
    generate = {"do_sample": False, **generate}

    def answer(prompt: str) -> str:
        out = pipe(prompt, max_new_tokens=max_new_tokens, return_full_text=False, **generate)
        return out[0]["generated_text"]

    return answer
