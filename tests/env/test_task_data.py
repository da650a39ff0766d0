"""Tests for the offline task assets: corpora, cache, tokenizers and sentiment scorer."""

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from cory_common.files import atomic_dir, cache_dir, cached_dir
from cory_env.data import arithmetic_corpus, corpus, scorer, sentiment_corpus, tokenizer

ROOT = Path(__file__).resolve().parents[1]
LAST_NUMBER = re.compile(r"(\d+)\D*$")
TRICKY = [
    "",
    "This movie was great!\n\"Quoted\" text, with 12345 and 0.5 and tabs\tand  two spaces.",
    "I can make this sentence \"The plot was dull\" more positive: The plot",
    "  leading spaces, unicode café – 😀\n\n",
]


def _reset_memo():
    tokenizer._load_tokenizer.cache_clear()
    scorer._load_scorer.cache_clear()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache root holding both tokenizers and the scorer, built once for this module."""
    root = tmp_path_factory.mktemp("cory-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CORY_CACHE", str(root))
        _reset_memo()
        for task in tokenizer.TASKS:
            tokenizer.task_tokenizer(task)
        scorer.sentiment_scorer()
    return root


@pytest.fixture
def cache(built, monkeypatch):
    """Point CORY_CACHE at the module's built cache."""
    monkeypatch.setenv("CORY_CACHE", str(built))
    return built


# ----------------------------------------------------------------------------- generators


def test_generators_are_deterministic():
    calls = [
        lambda s: sentiment_corpus.sentiment_reviews(50, s),
        lambda s: sentiment_corpus.sentiment_rewrites(50, s),
        lambda s: arithmetic_corpus.arithmetic_problems(50, s, "test"),
        lambda s: arithmetic_corpus.arithmetic_references(50, s),
        lambda s: corpus.pretraining_texts("sentiment", 50, s),
        lambda s: corpus.pretraining_texts("arithmetic", 50, s),
    ]
    for call in calls:
        assert call(3) == call(3)
        assert call(3) != call(4)


def test_reviews_are_balanced_varied_and_short():
    reviews = sentiment_corpus.sentiment_reviews(2000, 0)
    assert 0.45 < np.mean([y for _, y in reviews]) < 0.55
    vocab = {w.strip('.,!?"').lower() for text, _ in reviews for w in text.split()}
    assert len(vocab) > 400
    positive, negative = sentiment_corpus.sentiment_lexicon()
    assert len(vocab & positive) > 50 and len(vocab & negative) > 50
    for text, _ in reviews:
        assert 15 <= len(text.split()) <= 40
        assert 1 <= len(re.findall(r"[.!?](?= |$)", text)) <= 3
    assert any(" not " in t or " never " in t for t, _ in reviews)
    assert sum(t.startswith(("This ", "I ", "The ")) for t, _ in reviews) > 1000


def test_rewrites_copy_the_query_and_remove_negative_words():
    positive, negative = sentiment_corpus.sentiment_lexicon()
    changed = 0
    for s in sentiment_corpus.sentiment_rewrites(1000, 0):
        m = re.fullmatch(r'I can make this sentence "(.*)" more positive: (.*)', s, re.DOTALL)
        assert m, s
        original, rewrite = m.groups()
        query = os.path.commonprefix([original, rewrite])
        assert len(query.split()) >= 2
        changed += original != rewrite

        def n_neg(text):
            words = [w.strip('.,!?"').lower() for w in text.split()]
            return sum(w in negative for i, w in enumerate(words) if i == 0 or words[i - 1] not in
                       ("not", "never", "hardly", "from", "all"))

        assert n_neg(rewrite) <= n_neg(original)
    assert 200 < changed < 800


def test_arithmetic_solutions_end_with_the_answer():
    problems = arithmetic_corpus.arithmetic_problems
    for p in problems(500, 0) + problems(500, 0, "test"):
        assert set(p) == {"question", "solution", "answer"}
        assert int(p["answer"]) >= 0 and p["answer"] == str(int(p["answer"]))
        assert LAST_NUMBER.search(p["solution"]).group(1) == p["answer"]
        a, op, b, c = re.findall(r"(\d+) ([-+*]) (\d+) = (\d+)", p["solution"])[-1]
        assert c == p["answer"] and eval(f"{a} {op} {b}") == int(c)


def test_arithmetic_splits_are_disjoint():
    train = {p["question"] for p in arithmetic_corpus.arithmetic_problems(3000, 0, "train")}
    test = {p["question"] for p in arithmetic_corpus.arithmetic_problems(3000, 1, "test")}
    assert len(train) == 3000 and len(test) == 3000
    assert not train & test
    assert all(arithmetic_corpus.arith_split(q) == "test" for q in test)
    one_shot_question = arithmetic_corpus.ARITH_ONE_SHOT.splitlines()[0].removeprefix("Question: ")
    assert one_shot_question not in train | test
    with pytest.raises(ValueError):
        arithmetic_corpus.arithmetic_problems(1, 0, "valid")


def test_one_shot_and_references_format():
    assert re.fullmatch(r"Question: [^\n]+\nAnswer: [^\n]+\.\n", arithmetic_corpus.ARITH_ONE_SHOT)
    problems = arithmetic_corpus.arithmetic_problems(400, 5)
    right = 0
    for text, p in zip(arithmetic_corpus.arithmetic_references(400, 5), problems, strict=True):
        prompt = arithmetic_corpus.arith_prompt(p["question"])
        assert text.startswith(prompt.removesuffix("Answer:") + "Reference: ")
        assert text.endswith(f"\nAnswer: {p['solution']}")
        reference = re.search(r"\nReference: (.*)\n", text).group(1)
        right += reference == p["solution"]
        is_right = LAST_NUMBER.search(reference).group(1) == p["answer"]
        assert is_right == (reference == p["solution"])
    assert 0.4 < right / 400 < 0.6


def test_pretraining_mixtures():
    sentiment = corpus.pretraining_texts("sentiment", 1000, 0)
    assert len(sentiment) == 1000
    assert 250 < sum(t.startswith("I can make this sentence") for t in sentiment) < 350
    arithmetic = corpus.pretraining_texts("arithmetic", 1000, 0)
    assert all(t.startswith(arithmetic_corpus.ARITH_ONE_SHOT) for t in arithmetic)
    assert 350 < sum("\nReference: " in t for t in arithmetic) < 450
    with pytest.raises(ValueError):
        corpus.pretraining_texts("chess", 1, 0)


# ----------------------------------------------------------------------------- cache


def test_cache_dir_env_and_default(tmp_path, monkeypatch):
    monkeypatch.setenv("CORY_CACHE", str(tmp_path / "a" / "b"))
    assert cache_dir() == tmp_path / "a" / "b" and cache_dir().is_dir()
    monkeypatch.delenv("CORY_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "cory" and cache_dir().is_dir()


def test_atomic_write_leaves_nothing_on_error(tmp_path):
    final = tmp_path / "entry"
    with pytest.raises(RuntimeError), atomic_dir(final) as tmp:
        (tmp / "half.txt").write_text("partial")
        raise RuntimeError("build failed")
    assert list(tmp_path.iterdir()) == []
    cached_dir(final, lambda out: (out / "x.txt").write_text("whole"))
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]
    assert (final / "x.txt").read_text() == "whole"


def test_atomic_write_concurrent_builders_keep_one_whole_copy(tmp_path):
    # cache.py is imported on its own so the subprocesses skip the heavy cory_env package.
    script = textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from cory_common.files import atomic_dir
        with atomic_dir(Path(sys.argv[1])) as tmp:
            for i in range(3):
                (tmp / f"part{i}").write_text(sys.argv[2])
                time.sleep(0.1)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "cory_env" / "offline")}
    final = tmp_path / "entry"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(final), tag], env=env)
             for tag in ("first", "second")]
    assert [p.wait(timeout=30) for p in procs] == [0, 0]
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]
    contents = {(final / f"part{i}").read_text() for i in range(3)}
    assert len(contents) == 1 and contents <= {"first", "second"}


# ----------------------------------------------------------------------------- tokenizers


@pytest.mark.parametrize("task", tokenizer.TASKS)
def test_tokenizer_round_trip_and_special_tokens(cache, task):
    tok = tokenizer.task_tokenizer(task)
    assert tokenizer.task_tokenizer(task) is tok
    assert 500 <= len(tok) <= 1024
    assert tok.eos_token == tok.bos_token == tok.pad_token == tok.unk_token == tokenizer.EOS
    for text in TRICKY + corpus.pretraining_texts(task, 300, 7):
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("task", tokenizer.TASKS)
def test_tokenizer_digits_are_single_tokens(cache, task):
    tok = tokenizer.task_tokenizer(task)
    for token in tok.get_vocab():
        assert not re.search(r"\d", token) or len(token) == 1, token
    pieces = tok.convert_ids_to_tokens(tok.encode("so 12 + 345 = 357."))
    assert [p for p in pieces if p.isdigit()] == list("12345357")


def test_arithmetic_prompt_is_compact(cache):
    tok = tokenizer.task_tokenizer("arithmetic")
    assert len(tok.encode(arithmetic_corpus.ARITH_ONE_SHOT)) < 70


# ----------------------------------------------------------------------------- scorer


def test_scorer_ranks_positive_above_negative(cache):
    model = scorer.sentiment_scorer()
    assert model.accuracy > 0.9
    logits = model([
        "This movie was wonderful and moving.", "This movie was boring and awful.",
        "This movie was not bad at all.", "This movie was not good at all.",
        "I would recommend it to anyone.", "I would not recommend it to anyone.",
    ])
    assert logits.dtype == np.float32 and logits.shape == (6,)
    assert logits[0] > 0 > logits[1] and logits[2] > logits[3] and logits[4] > 0 > logits[5]
    positive, negative = sentiment_corpus.sentiment_lexicon()
    pos = model([f"The acting is {w}." for w in sorted(positive)])
    neg = model([f"The acting is {w}." for w in sorted(negative)])
    assert pos.mean() > 0.5 > -0.5 > neg.mean()


def test_saturated_sentiment_reward_levels_off_like_a_classifier_logit(cache):
    from cory_env import make_task

    plain, capped = make_task("sentiment"), make_task("sentiment", saturation=2.0)
    queries = plain.queries("test")[:3]
    answers = [" great great great wonderful", " awful", " ok"]
    logits, rewards = plain.reward(queries, answers), capped.reward(queries, answers)
    assert np.allclose(rewards, 2.0 * np.tanh(logits / 2.0), atol=1e-6)
    assert np.all(np.abs(rewards) < 2.0) and np.all(np.sign(rewards) == np.sign(logits))
    with pytest.raises(ValueError, match="saturation must be None or a positive number, got 0"):
        make_task("sentiment", saturation=0)


def test_scorer_is_finite_fast_and_accurate_on_fresh_reviews(cache):
    model = scorer.sentiment_scorer()
    assert np.isfinite(model(TRICKY + ["!!!", "123", "x" * 10_000])).all()
    reviews = sentiment_corpus.sentiment_reviews(256, 12345)
    texts = [t for t, _ in reviews]
    start = time.perf_counter()
    logits = model(texts)
    assert time.perf_counter() - start < 0.2
    assert np.mean((logits > 0) == np.array([y for _, y in reviews], bool)) > 0.9


# ----------------------------------------------------------------------------- caching


def test_second_call_loads_from_disk_without_retraining(cache, monkeypatch):
    files = [p for p in cache.rglob("*") if p.is_file()]
    mtimes = {p: p.stat().st_mtime_ns for p in files}
    before = scorer.sentiment_scorer()(TRICKY)
    _reset_memo()

    def no_training(*args):
        raise AssertionError("the cached asset was rebuilt")

    monkeypatch.setattr(tokenizer, "_train_tokenizer", no_training)
    monkeypatch.setattr(scorer, "_train_scorer", no_training)
    for task in tokenizer.TASKS:
        assert len(tokenizer.task_tokenizer(task)) >= 500
    np.testing.assert_array_equal(scorer.sentiment_scorer()(TRICKY), before)
    assert {p: p.stat().st_mtime_ns for p in files} == mtimes
    assert not [p for p in cache.rglob("*") if p.name.startswith(".")]


def test_builds_are_reproducible(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CORY_CACHE", str(tmp_path))
    for task in tokenizer.TASKS:
        tokenizer.task_tokenizer(task)
    scorer.sentiment_scorer()
    for rel in ["tokenizers/sentiment-v1/tokenizer.json", "tokenizers/arithmetic-v2/tokenizer.json",
                "scorers/sentiment-v1/weights.npy", "scorers/sentiment-v1/vocab.json"]:
        assert (tmp_path / rel).read_bytes() == (cache / rel).read_bytes(), rel
