"""The HF loaders of the imdb and gsm8k tasks, exercised offline through local folders."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
import torch
from helpers import toy_tokenizer
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DistilBertConfig

import cory_env
from cory_env import BatchedCoryEnv, make_task
from cory_env.tasks.base import exact_match_reward, last_number
from cory_env.tasks.hf import GSM8K_ONE_SHOT

REVIEWS = [
    "the movie was very good and I liked it the acting is great and the plot is good " * 2,
    "the plot is awful and the acting is bad I can not make this movie more positive " * 2,
    "short review",  # under 100 characters: filtered out
]


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """A tiny policy tokenizer, sentiment classifier and imdb/gsm8k datasets in HF formats."""
    root = tmp_path_factory.mktemp("hf")
    tok = toy_tokenizer()
    tok.save_pretrained(root / "policy")
    torch.manual_seed(0)
    cfg = DistilBertConfig(vocab_size=len(tok), dim=16, hidden_dim=32, n_layers=1, n_heads=2,
                           max_position_embeddings=128, pad_token_id=tok.pad_token_id,
                           id2label={0: "NEGATIVE", 1: "POSITIVE"},
                           label2id={"NEGATIVE": 0, "POSITIVE": 1})
    AutoModelForSequenceClassification.from_config(cfg).save_pretrained(root / "clf")
    tok.save_pretrained(root / "clf")
    imdb = root / "imdb"
    imdb.mkdir()
    with open(imdb / "train.jsonl", "w") as f:
        for text in REVIEWS:
            f.write(json.dumps({"text": text, "label": 1}) + "\n")
    gsm = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({
            "question": ["Tom has 3 apples and buys 4 more. How many apples?"],
            "answer": ["He has 3 + 4 = 7 apples.\n#### 7"]}),
        "test": datasets.Dataset.from_dict({
            "question": ["A box holds 1,200 pens. How many pens are in two boxes?"],
            "answer": ["2 * 1200 = 2400\n#### 2,400"]}),
    })
    gsm.save_to_disk(str(root / "gsm8k"))
    return root


def test_imdb_task_loads_filters_and_scores_with_the_classifier(hf_folders):
    task = make_task("imdb", dataset=str(hf_folders / "imdb"), reward_model=str(hf_folders / "clf"),
                     tokenizer=str(hf_folders / "policy"))
    queries = task.queries("train")
    assert len(queries) == 2  # the short review is filtered out
    for q, review in zip(queries, REVIEWS):
        assert 2 <= len(q.ids) <= 8 and review.startswith(q.text)
    env = BatchedCoryEnv(batch_size=2, task=task, max_new_tokens=3)
    env.reset(options={"queries": [0, 1]})
    good = task.tokenizer.convert_tokens_to_ids("good")
    while not env.finished:
        _, rewards, _, _, infos = env.step(torch.tensor([good, good]))
    clf = AutoModelForSequenceClassification.from_pretrained(hf_folders / "clf").eval()
    ctok = AutoTokenizer.from_pretrained(hf_folders / "clf")
    texts = [q.text + r for q, r in zip(queries, infos["llm_0"]["response"])]
    with torch.no_grad():
        expected = clf(**ctok(texts, return_tensors="pt", padding=True)).logits[:, 1]
    np.testing.assert_allclose(infos["llm_0"]["task_reward"].numpy(), expected.numpy(), atol=1e-5)
    obs_text = env.turn_batch("llm_1")
    ids = obs_text["input_ids"][0][obs_text["attention_mask"][0] == 1][:-3]
    assert task.tokenizer.decode(ids.tolist()).startswith('I can make this sentence "')


def test_gsm8k_task_template_answers_and_reward(hf_folders):
    task = make_task("gsm8k", dataset=str(hf_folders / "gsm8k"),
                     tokenizer=str(hf_folders / "policy"))
    train, test = task.queries("train"), task.queries("test")
    assert train[0].answer == "7" and test[0].answer == "2400"
    assert task.pioneer_template.startswith(GSM8K_ONE_SHOT)
    assert task.observer_template.endswith("Question: {query}\nReference: {response}\nAnswer:")
    r = task.reward(test * 3, ["so 2400 pens", "about 2,400.", "2400 then 12"])
    assert r.tolist() == [1.0, 1.0, 0.0]
    env = cory_env.env(task=task, max_new_tokens=2)
    env.reset(options={"queries": [0]})
    assert env.agent_selection == "llm_0"


def test_last_number_and_exact_match():
    assert last_number("so 3 + 4 = 7.") == "7"
    assert last_number("it costs $1,250.00 in all") == "1250"
    assert last_number("no digits") is None
    assert last_number("-3 degrees") == "-3"
    q = [cory_env.Query("q", answer="12")]
    assert exact_match_reward(q * 2, ["12", "twelve"]).tolist() == [1.0, 0.0]


def test_registry_accepts_user_tasks():
    from helpers import ToyTask

    cory_env.register_task("toy-registered", ToyTask)
    assert "toy-registered" in cory_env.registered_tasks()
    env = cory_env.env(task="toy-registered")
    env.reset(seed=0)
    assert env.unwrapped.task.name == "toy"
