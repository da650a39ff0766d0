"""Tasks on Hugging Face data and models: `imdb` and `gsm8k` (the paper's two settings).

They load through `datasets.load_dataset` / `from_pretrained`, so a hub name works where a
hub is reachable and a local folder in the same format works everywhere (the tests use that).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from cory_common.files import check_local_path
from cory_common.pretrained import load_tokenizer

from .base import Query, Task, exact_match_reward, register_task, response_slot
from .rewards import VADER, VADER_SCALE, check_scale, check_vader, vader

GSM8K_ONE_SHOT = (
    "Question: Shawn has five toys. For Christmas, he got two toys each from his mom and dad. "
    "How many toys does he have now?\n"
    "Answer: Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is "
    "4 more toys. 5 + 4 = 9.\n"
)
IMDB_OBSERVER = 'I can make this sentence "{query}{response}" more positive: {query}'


def rewrite_chain(position: int) -> str:
    """IMDB's observer prompt for chain position >= 2: every earlier continuation listed as a
    quoted sentence, then the query to continue."""
    quoted = " ".join(f'"{{query}}{response_slot(j)}"' for j in range(1, position + 1))
    return f"I can make these sentences {quoted} more positive: {{query}}"


def reference_chain(one_shot: str, position: int) -> str:
    """The GSM8K-style prompt for chain position >= 2: numbered `Reference j:` lines."""
    refs = "".join(f"Reference {j}: {response_slot(j)}\n" for j in range(1, position + 1))
    return one_shot + "Question: {query}\n" + refs + "Answer:"


def load_split(dataset: str, split: str, config: str | None = None):
    """Load one split from a hub name, a `save_to_disk` folder, or a data folder."""
    import datasets

    if os.path.isdir(dataset) and (
        os.path.exists(os.path.join(dataset, "dataset_dict.json"))
        or os.path.exists(os.path.join(dataset, "state.json"))
    ):
        loaded = datasets.load_from_disk(dataset)
        return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
    return datasets.load_dataset(dataset, config, split=split)


def prefix_queries(texts: Sequence[str], tokenizer, lengths=(2, 8), seed=0) -> list[Query]:
    """Queries made of each text's first k tokens, k uniform in [lengths[0], lengths[1]]."""
    if not texts:
        return []
    rng = np.random.default_rng(seed)
    ks = rng.integers(lengths[0], lengths[1] + 1, size=len(texts))
    encoded = tokenizer([t[:200] for t in texts], add_special_tokens=False)["input_ids"]
    out = []
    for ids, k in zip(encoded, ks):
        ids = tuple(ids[: int(k)])
        out.append(Query(text=tokenizer.decode(list(ids)), ids=ids))
    return out


@register_task("imdb")
class IMDBTask(Task):
    """IMDB review continuation; reward = the POSITIVE logit of a sentiment classifier, or
    `reward_model="vader"`: reward_scale x VADER compound (no classifier, no download)."""

    name = "imdb"
    observer_template = IMDB_OBSERVER
    takes_run_tokenizer = True
    default_max_new_tokens = 16
    default_context_len = 96

    def __init__(self, dataset: str = "imdb", reward_model: str = "lvwerra/distilbert-imdb",
                 tokenizer: str = "gpt2", min_chars: int = 100, prompt_tokens=(2, 8),
                 max_queries: int | None = None, reward_device: str = "cpu",
                 reward_batch_size: int = 64, seed: int = 0, reward_scale: float = VADER_SCALE):
        super().__init__()
        if not isinstance(reward_model, str) or not reward_model:
            raise ValueError(f"reward_model must be 'vader' or a classifier's name or folder, "
                             f"got {reward_model!r}")
        if reward_model == VADER:
            check_vader()
        else:
            check_local_path("reward_model", reward_model)
        self.reward_scale = check_scale("reward_scale", reward_scale)
        self.dataset, self.reward_model_name, self.tokenizer_name = dataset, reward_model, tokenizer
        self.min_chars, self.prompt_tokens, self.max_queries = min_chars, prompt_tokens, max_queries
        self.reward_device, self.reward_batch_size = reward_device, reward_batch_size
        self.seed = seed
        self._classifier = None

    def chain_template(self, position: int) -> str:
        """Chain position >= 2: the earlier continuations listed (`rewrite_chain`)."""
        return rewrite_chain(position)

    def build_tokenizer(self):
        """The policy's tokenizer (GPT-2 by default)."""
        return load_tokenizer(self.tokenizer_name)

    def load_queries(self, split: str) -> list[Query]:
        """Reviews longer than `min_chars`, cut to their first 2-8 tokens."""
        data = load_split(self.dataset, split)
        texts = [t for t in data["text"] if len(t) > self.min_chars]
        if not texts:
            raise ValueError(f"imdb: no review in split {split!r} of {self.dataset!r} is longer "
                             f"than min_chars={self.min_chars} (of {len(data)}); lower min_chars")
        if self.max_queries:
            texts = texts[: self.max_queries]
        return prefix_queries(texts, self.tokenizer, self.prompt_tokens, self.seed)

    def _load_classifier(self):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.reward_model_name)
        model = AutoModelForSequenceClassification.from_pretrained(self.reward_model_name)
        model.to(self.reward_device).eval()
        label2id = {k.upper(): v for k, v in (model.config.label2id or {}).items()}
        positive = label2id.get("POSITIVE", label2id.get("LABEL_1", 1))
        self._classifier = (tok, model, positive)

    def reward(self, queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
        """The classifier's raw POSITIVE logit of query + response (or the scaled VADER score)."""
        import torch

        if self.reward_model_name == VADER:
            return vader([q.text + r for q, r in zip(queries, responses)], self.reward_scale)
        if self._classifier is None:
            self._load_classifier()
        tok, model, positive = self._classifier
        texts = [q.text + r for q, r in zip(queries, responses)]
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.reward_batch_size):
                enc = tok(texts[i:i + self.reward_batch_size], return_tensors="pt",
                          padding=True, truncation=True, max_length=512).to(self.reward_device)
                out.append(model(**enc).logits[:, positive].float().cpu())
        return torch.cat(out).numpy() if out else np.zeros(0, np.float32)


@register_task("gsm8k")
class GSM8KTask(Task):
    """GSM8K with the paper's one-shot template; reward = exact match of the last number."""

    name = "gsm8k"
    takes_run_tokenizer = True
    exact_match = True
    pioneer_template = GSM8K_ONE_SHOT + "Question: {query}\nAnswer:"
    observer_template = GSM8K_ONE_SHOT + "Question: {query}\nReference: {response}\nAnswer:"
    default_max_new_tokens = 128
    default_context_len = 768

    def __init__(self, dataset: str = "gsm8k", config: str = "main",
                 tokenizer: str = "meta-llama/Llama-2-7b-chat-hf", max_queries: int | None = None):
        super().__init__()
        self.dataset, self.config, self.tokenizer_name = dataset, config, tokenizer
        self.max_queries = max_queries

    def chain_template(self, position: int) -> str:
        """Chain position >= 2: numbered references (`reference_chain`)."""
        return reference_chain(GSM8K_ONE_SHOT, position)

    def build_tokenizer(self):
        """The policy's tokenizer (Llama-2-7b-chat by default)."""
        return load_tokenizer(self.tokenizer_name)

    def load_queries(self, split: str) -> list[Query]:
        """Questions with the number after '####' as the answer."""
        data = load_split(self.dataset, split, self.config)
        rows = list(zip(data["question"], data["answer"]))[: self.max_queries or None]
        return [Query(text=q, answer=a.split("####")[-1].strip().replace(",", ""))
                for q, a in rows]

    def reward(self, queries: Sequence[Query], responses: Sequence[str]) -> np.ndarray:
        """1 if the response's last number equals the answer, else 0."""
        return exact_match_reward(queries, responses)
