"""The timing workloads' shared pieces: the reference task and one TrainConfig builder.

The reference workload is the GPT-2-shaped model written by `reference_model.py` (4 layers,
n_embd 256, vocab 2048, random init), 64 prompts of 2-8 tokens taken from CPython's pydoc
topics, 16 new tokens, 4 PPO epochs of mini-batch 16, full KL, top_k 0 / top_p 1, repetition
penalty 1.1, a cheap deterministic reward (vowel ratio): what `trl_anchor.py --workload
reference` times too. `gpu_check.py`'s paper shapes use the same `train_config`.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `python tools/perf/<tool>.py`
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from cory_env import Query, Task, register_task  # noqa: E402

IMDB_OBSERVER = 'I can make this sentence "{query}{response}" more positive: {query}'
VOWELS = frozenset("aeiou")


def vowel_ratio(texts: Sequence[str]) -> np.ndarray:
    """The anchor's reward: vowels / (1 + characters) of each text."""
    return np.array([sum(c in VOWELS for c in t) / (1 + len(t)) for t in texts], np.float64)


@register_task("perf-ref")
class ReferenceWorkload(Task):
    """2-8-token prefixes of pydoc-topic text; reward = vowel ratio of query + response."""

    name = "perf-ref"
    observer_template = IMDB_OBSERVER
    default_max_new_tokens = 16
    default_context_len = 64

    def __init__(self, model: str, n_queries: int = 2048, seed: int = 0):
        super().__init__()
        self.model, self.n_queries, self.seed = model, n_queries, seed

    def build_tokenizer(self):
        """The reference model's tokenizer."""
        from cory_common.pretrained import load_tokenizer

        return load_tokenizer(self.model)

    def load_queries(self, split: str) -> list[Query]:
        """n_queries windows of 8 words cut to 2-8 tokens, as trl_anchor.py draws them."""
        import pydoc_data.topics as topics

        words = " ".join(topics.topics.values()).split()
        rng = random.Random(self.seed + (split != "train"))
        out = []
        for _ in range(self.n_queries):
            i = rng.randrange(len(words) - 10)
            ids = self.tokenizer.encode(" ".join(words[i:i + 8]), add_special_tokens=False)
            ids = ids[: rng.randint(2, 8)] or [0]
            out.append(Query(text=self.tokenizer.decode(ids), ids=tuple(ids)))
        return out

    def reward(self, queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
        """Vowel ratio of query + response (negligible cost, like the anchor's)."""
        return vowel_ratio([q.text + r for q, r in zip(queries, responses)])


def zero_reward(task: Task) -> Task:
    """The task with its reward replaced by zeros, to time the env without reward computation."""
    task.reward = lambda queries, responses: np.zeros(len(responses))
    return task


def train_config(model: str, method: str, *, task: str = "perf-ref", batch_size: int = 64,
                 mini_batch_size: int = 16, max_new_tokens: int = 16,
                 settings: dict | None = None):
    """A timing job's TrainConfig: 4 PPO epochs, full KL, `iterations` unbounded. `settings`
    maps config paths to values (`{"ppo.max_tokens_per_pass": 512, "lora": True}`), set as the
    command line sets them (`cory_common.cli.apply`); the reference workload adds its
    repetition penalty 1.1 and KL coefficient 0.3."""
    from agents.learners.ppo_config import KLConfig, PPOConfig
    from agents.llm.sampling import SamplingConfig
    from agents.training.config import TrainConfig
    from cory_common import cli

    reference = task == "perf-ref"
    ppo = PPOConfig(mini_batch_size=mini_batch_size, ppo_epochs=4,
                    kl=KLConfig(penalty="full", **({"coef": 0.3} if reference else {})))
    cfg = TrainConfig(task=task, task_options={"model": model} if reference else {},
                      method=method, model=model, batch_size=batch_size,
                      max_new_tokens=max_new_tokens, iterations=10**6, ppo=ppo,
                      sampling=SamplingConfig(repetition_penalty=1.1 if reference else 1.0))
    paths = {tuple(k.split(".")): v for k, v in (settings or {}).items()}
    return cli.apply(cfg, paths).validate()


def context_len(resp: int) -> int:
    """Observation width that fits the observer's merge prompt (template + 2 queries + answer)."""
    return 2 * resp + 32


def solo_env(model: str, batch: int, resp: int, device: str):
    """A single-agent env of the reference workload (no reward), on `device`."""
    from cory_env import BatchedCoryEnv

    return BatchedCoryEnv(batch_size=batch, task=zero_reward(ReferenceWorkload(model)),
                          tokenizer=model, max_new_tokens=resp, context_len=context_len(resp),
                          n_agents=1, seed=0, device=device)
