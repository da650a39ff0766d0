"""The CORY env in words: each agent reads its prompt as a string and answers with a string.

    env = cory_env.text_env(task="reasoning")
    env.reset(seed=0)
    for agent in env.agent_iter():
        prompt, reward, term, trunc, info = env.last()
        env.step(None if term or trunc else my_policy(prompt))   # my_policy: str -> str

It is the token env (`cory_env.env`) underneath, with the same tasks, roles, rotation, chains,
rewards, seeds and reset options; only the step changes. Each agent takes one step per turn:
its observation is its whole prompt (the observer's shows the pioneer's answer through the
task's template), and its action is its answer, which is tokenized with the env's tokenizer
(no special tokens added), cut after the first EOS or at `max_new_tokens` tokens, ended with
EOS when shorter, and played token by token. So a token policy's decoded answers give the
same rewards here as there. `infos[agent]["response"]` is the answer as the env kept it.

Spaces are Gymnasium `Text` spaces sized from the tokenizer: the characters of its single
tokens (plus those of the task's queries and templates), and at most `max_new_tokens` (answer)
or prompt-length (observation) times its longest token's characters. A prompt is a `str`
(the subclass `Prompt`, which carries numpy's unicode dtype for PettingZoo's checks); before
an agent's turn its prompt is "". `state()` is every position's prompt and answer, in acting
order, one per line. `text_parallel_env` is PettingZoo's turn-based parallel view of it.
"""

from __future__ import annotations

import weakref

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils import wrappers
from pettingzoo.utils.conversions import turn_based_aec_to_parallel

from .aec import raw_env


class Prompt(str):
    """A prompt or answer string; `dtype` lets PettingZoo's space checks accept it."""

    dtype = np.dtype(str)


def text_env(**config):
    """The text AEC env with PettingZoo's order-enforcing wrapper."""
    return wrappers.OrderEnforcingWrapper(raw_text_env(**config))


def text_parallel_env(**config):
    """The parallel API of the text env (only the acting agent's answer is used)."""
    return turn_based_aec_to_parallel(raw_text_env(**config))


_CHARSETS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_strings(tokenizer) -> tuple[frozenset[str], int]:
    """(characters of the tokenizer's single tokens, longest token in characters), cached."""
    if tokenizer not in _CHARSETS:
        words = tokenizer.batch_decode([[i] for i in range(len(tokenizer))],
                                       skip_special_tokens=False)
        _CHARSETS[tokenizer] = (frozenset("".join(words)), max(map(len, words)))
    return _CHARSETS[tokenizer]


class raw_text_env(AECEnv):
    """CORY's K-LLM env with string observations and string actions (see the module docstring)."""

    metadata = {"name": "cory_text_v0", "render_modes": ["human", "ansi"],
                "is_parallelizable": True}

    def __init__(self, **config):
        if config.get("action_mask"):
            raise ValueError("action_mask=True has no meaning in the text env (its actions are "
                             "strings); leave it False")
        self.tokens = raw_env(**config)
        self.config, self.task = self.tokens.config, self.tokens.task
        self.tokenizer, self.render_mode = self.tokens.tokenizer, self.tokens.render_mode
        self.possible_agents = list(self.tokens.possible_agents)
        chars, longest = token_strings(self.tokenizer)
        turns = self.tokens.max_num_agents
        chars |= {c for q in self.task.queries(self.config.split) for c in q.text}
        chars |= {c for t in self.tokens.episodes.templates for c in t.text}
        charset = "".join(sorted(chars))
        P, T = self.tokens.prompt_len, self.tokens.max_new_tokens
        self._obs_space = spaces.Text(P * longest, min_length=0, charset=charset)
        self._act_space = spaces.Text(T * longest, min_length=0, charset=charset)
        self.state_space = spaces.Text(turns * ((P + T) * longest + 1),
                                       min_length=0, charset=charset)

    # -- the token env's bookkeeping, seen through -----------------------------------------
    agents = property(lambda self: self.tokens.agents)
    agent_selection = property(lambda self: self.tokens.agent_selection)
    rewards = property(lambda self: self.tokens.rewards)
    _cumulative_rewards = property(lambda self: self.tokens._cumulative_rewards)
    terminations = property(lambda self: self.tokens.terminations)
    truncations = property(lambda self: self.tokens.truncations)
    infos = property(lambda self: self.tokens.infos)

    def observation_space(self, agent):
        """The (cached) Text space of a prompt."""
        return self._obs_space

    def action_space(self, agent):
        """The (cached) Text space of an answer."""
        return self._act_space

    def reset(self, seed=None, options=None):
        """Start an episode, exactly as the token env's reset (same seeds and options)."""
        self.tokens.reset(seed=seed, options=options)

    def observe(self, agent) -> Prompt:
        """The agent's prompt as a string ("" before its turn)."""
        return self._decode(self.tokens.prompt_ids(agent))

    def state(self) -> Prompt:
        """Every position's prompt and answer, in acting order, one per line."""
        return Prompt("\n".join(self._decode(np.concatenate([self.tokens.prompt_ids(a),
                                                             self.answer_tokens(a)]))
                                for a in self.tokens.order()))

    def answer_tokens(self, agent) -> np.ndarray:
        """The agent's answer as the env kept it, EOS left out."""
        ids = self.tokens.answer_ids(agent)
        return ids[:-1] if len(ids) and ids[-1] == self.tokenizer.eos_token_id else ids

    def encode(self, answer: str) -> list[int]:
        """The tokens an answer is played as: cut after the first EOS or at the turn's cap,
        ended with EOS when shorter."""
        return self._played(self._tokens(answer))

    def _tokens(self, answer: str) -> list[int]:
        """The answer's tokens, uncut (a str of valid text, else an error naming the role)."""
        if not isinstance(answer, str):
            raise TypeError(f"action must be the answer as a str, got {answer!r} "
                            f"({type(answer).__name__})")
        try:
            answer.encode("utf-8")
        except UnicodeEncodeError as err:
            role = self.tokens.infos[self.tokens.agent_selection]["role"]
            raise ValueError(f"the {role}'s answer "
                             f"{answer!r:.80} is not valid text: {err.reason} at character "
                             f"{err.start} ({answer[err.start]!r})") from None
        return self.tokenizer.encode(answer, add_special_tokens=False)

    def _played(self, full: list[int]) -> list[int]:
        """`encode`'s cut of the uncut tokens."""
        eos, cap = self.tokenizer.eos_token_id, self.tokens.answer_cap
        ids = full[:cap]
        if eos in ids:
            ids = ids[: ids.index(eos) + 1]
        return ids + [eos] if len(ids) < cap and (not ids or ids[-1] != eos) else ids

    def step(self, action):
        """Play the selected agent's answer (a str); a finished agent steps with None."""
        agent = self.tokens.agent_selection
        if self.tokens.terminations[agent] or self.tokens.truncations[agent]:
            self.tokens.step(action)
            return
        full = self._tokens(action)
        ids = self._played(full)
        for token in ids:
            self.tokens.step(token)
        self.tokens.infos[agent].update(self.answer_flags(action, full, ids))

    def answer_flags(self, answer: str, full: list[int], played: list[int]) -> dict:
        """What became of an answer (its `full` tokens, the `played` ones): "answer_cut_tokens",
        the tokens past the turn's cap (0: none), and "answer_played_as", the text played when
        the tokenizer could not keep the answer as given (words it does not know), else None."""
        eos = self.tokenizer.eos_token_id
        content = full[: full.index(eos)] if eos in full else full
        cut = max(0, len(content) - self.tokens.answer_cap)
        kept = [t for t in played if t != eos]
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        before_eos = answer.split(self.tokenizer.eos_token)[0] if self.tokenizer.eos_token else \
            answer
        altered = not cut and " ".join(text.split()) != " ".join(before_eos.split())
        return {"answer_cut_tokens": cut, "answer_played_as": text if altered else None}

    def render(self):
        """"ansi" returns the transcript, "human" prints it (the token env's render)."""
        return self.tokens.render()

    def close(self):
        """Nothing to release."""

    def _decode(self, ids) -> Prompt:
        return Prompt(self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=False))
