"""Tests for the offline reference LMs (agents.refmodels), on the fast "tiny" size."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, GPT2LMHeadModel

from agents.refmodels import data as refdata
from agents.refmodels import measure, pretrain
from cory_env.data import scorer, tokenizer

REPORT_KEYS = {"task", "size", "model", "train", "heldout_perplexity", "samples", "copy",
               "gap", "observer_gap", "pioneer_pass@1", "eval_episodes"}


def _reset_memo():
    tokenizer._load_tokenizer.cache_clear()
    scorer._load_scorer.cache_clear()


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    """One cache root for the module, where both tiny models get built once."""
    return tmp_path_factory.mktemp("cory-lm-cache")


@pytest.fixture
def cache(cache_root, monkeypatch):
    monkeypatch.setenv("CORY_CACHE", str(cache_root))
    monkeypatch.delenv(pretrain.SIZE_ENV, raising=False)
    return cache_root


@pytest.mark.parametrize("task", ["sentiment", "arithmetic"])
def test_build_gives_loadable_model_tokenizer_and_report(cache, task):
    path = pretrain.reference_lm(task, size="tiny", verbose=False)
    assert path == cache / "models" / f"{task}-tiny-{pretrain.VERSIONS[task]}"
    model = GPT2LMHeadModel.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.vocab_size == len(tok) == len(tokenizer.task_tokenizer(task))
    assert tok.eos_token_id == tokenizer.task_tokenizer(task).eos_token_id
    ids = torch.tensor([tok.encode("The answer is 9.")])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))

    report = json.loads((path / "report.json").read_text())
    assert REPORT_KEYS <= set(report)
    assert report["task"] == task and report["size"] == "tiny"
    gap = report["gap"]
    assert report["observer_gap"] == pytest.approx(
        gap["observer_reward_kt"] - gap["observer_reward_no_kt"])
    assert all(np.isfinite(v) for v in gap.values())
    assert all(np.isfinite(v) for v in report["copy"].values())
    assert len(report["samples"]) == pretrain.SIZES["tiny"][task].n_samples
    assert {"query", "pioneer", "observer", "rewards"} <= set(report["samples"][0])
    if task == "arithmetic":
        assert 0.0 <= report["pioneer_pass@1"] <= 1.0
        assert 0.0 <= report["copy"]["copy_correct_reference"] <= 1.0
    else:
        assert 0.0 <= report["copy"]["content_word_copy_rate"] <= 1.0
    # it learned something: far better than a uniform guess over the vocabulary
    assert report["heldout_perplexity"] < len(tok) / 5


def test_second_call_reuses_the_cache(cache, monkeypatch):
    path = pretrain.reference_lm("arithmetic", size="tiny", verbose=False)
    mtime = (path / "model.safetensors").stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("retrained although cached")

    monkeypatch.setattr(pretrain, "_train", fail)
    assert pretrain.reference_lm("arithmetic", size="tiny") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime


def test_size_comes_from_the_environment(cache, monkeypatch):
    monkeypatch.setenv(pretrain.SIZE_ENV, "tiny")
    assert pretrain.resolve_size() == "tiny"
    version = pretrain.VERSIONS["arithmetic"]
    assert pretrain.model_dir("arithmetic") == cache / "models" / f"arithmetic-tiny-{version}"
    monkeypatch.delenv(pretrain.SIZE_ENV)
    assert pretrain.resolve_size() == "full"
    with pytest.raises(ValueError, match="size"):
        pretrain.resolve_size("huge")
    with pytest.raises(ValueError, match="task"):
        pretrain.reference_lm("poetry", size="tiny")


def test_build_report_reads_a_model_folder(cache):
    path = pretrain.reference_lm("arithmetic", size="tiny", verbose=False)
    again = measure.build_report("arithmetic", path)
    saved = json.loads((path / "report.json").read_text())
    assert again["heldout_perplexity"] == pytest.approx(saved["heldout_perplexity"], rel=1e-4)
    assert again["gap"] == pytest.approx(saved["gap"])  # seeded sampling


def test_tiny_builds_are_deterministic(tmp_path, monkeypatch):
    weights = []
    for name in ("a", "b"):
        monkeypatch.setenv("CORY_CACHE", str(tmp_path / name))
        _reset_memo()
        path = pretrain.reference_lm("arithmetic", size="tiny", verbose=False)
        weights.append(GPT2LMHeadModel.from_pretrained(path).state_dict())
    _reset_memo()
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key


def test_training_sequences_match_the_env_prompts(cache):
    """The env's prompt tokens are a prefix of a pretraining sequence built the same way."""
    import cory_env

    for task in ("arithmetic", "sentiment"):
        data = refdata.TrainingData(task)
        env = cory_env.BatchedCoryEnv(batch_size=1, task=task, split="test")
        obs = env.reset(seed=0)
        prompt = obs["input_ids"][0][obs["attention_mask"][0].bool()].tolist()
        q = env.episodes.queries[0]
        ids = list(q.ids) if q.ids is not None else data.tok.encode(q.text)
        assert refdata._assemble(data.pio, ids) == prompt


def test_shared_prefix_loss_equals_the_plain_loss(cache):
    """Computing the common one-shot prefix once gives the same loss and gradients."""
    data = refdata.TrainingData("arithmetic")
    seqs = data.sequences(6, seed=5)
    ids, mask, weights = refdata.pad_rows(seqs, range(6), data.eos, prompt_weight=0.5)
    assert pretrain._common_prefix(ids, mask) >= 16
    model = pretrain._new_model(len(data.tok), data.eos, pretrain.SIZES["tiny"]["arithmetic"])
    results = []
    for min_shared in (16, 10**9):
        model.zero_grad()
        loss = pretrain.lm_loss(model, ids, mask, weights, min_shared=min_shared)
        loss.backward()
        results.append((loss.item(), model.transformer.wte.weight.grad.clone()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-4, atol=1e-6)



def test_build_child_waits_by_the_one_rule_only_when_this_process_cannot(monkeypatch):
    """The build child gets the rule's policy (passive on a busy machine) when the policy in
    force here differs; a policy this process already runs under builds in-process."""
    from cory_common import threads

    assert 0 <= threads.busy_cores(0.05) <= (pretrain.os.cpu_count() or 1) + 0.5
    launched = []
    monkeypatch.setattr(pretrain.subprocess, "run", lambda cmd, env, check: launched.append(env))
    monkeypatch.setattr(pretrain, "build", lambda *a, **k: launched.append("in-process"))
    monkeypatch.setattr(threads, "busy_cores", lambda seconds=0.1: 2.0)
    monkeypatch.setattr(pretrain, "policy_in_force", lambda: None)
    for var in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "CORY_WAIT_CHOSEN"):
        monkeypatch.delenv(var, raising=False)
    pretrain._launch("arithmetic", "full", pretrain.Path("unused"))
    assert launched[-1]["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in launched[-1]
    assert "OMP_WAIT_POLICY" not in pretrain.os.environ  # the library changed nothing here
    monkeypatch.setattr(threads, "busy_cores", lambda seconds=0.1: 0.0)  # idle: OpenMP's own
    pretrain._launch("arithmetic", "full", pretrain.Path("unused"))
    assert launched[-1] == "in-process"


def test_repeated_gap_resamples_with_fixed_seeds(cache):
    path = pretrain.reference_lm("arithmetic", size="tiny", verbose=False)
    first, again = (measure.repeated_gap("arithmetic", path, 2) for _ in range(2))
    assert first == again  # seeded
    assert len(first["gaps"]) == 2 and first["mean"] == pytest.approx(np.mean(first["gaps"]))
    assert first["episodes_each"] == pretrain.SIZES["tiny"]["arithmetic"].eval_episodes


def test_a_task_names_its_offline_model_and_a_new_one_inherits_it(cache, monkeypatch):
    """`Task.offline_model` is the one place that says which reference LM a task trains from
    when a run names no model: a user's task built on the sentiment task needs no other edit."""
    import cory_env
    from agents.training.config import TrainConfig
    from agents.training.train import Trainer, default_model
    from cory_env.tasks.offline import SentimentTask

    monkeypatch.setenv(pretrain.SIZE_ENV, "tiny")

    @cory_env.register_task("my-reviews")
    class MyReviews(SentimentTask):
        """A user's variant of the sentiment task."""

    assert cory_env.offline_model("my-reviews") == "sentiment"
    assert cory_env.offline_model("sentiment") == "sentiment"
    assert cory_env.offline_model("arithmetic") == "arithmetic"
    assert cory_env.offline_model("reviews") is None and cory_env.offline_model("gsm8k") is None
    assert default_model("my-reviews") == str(pretrain.reference_lm("sentiment"))
    with pytest.raises(ValueError, match="task 'reviews' has no offline reference LM"):
        default_model("reviews")
    trainer = Trainer(TrainConfig(task="my-reviews", method="ppo", batch_size=4, iterations=1))
    assert trainer.step()["llm_0"]["response_length"] > 0


def test_the_command_builds_quietly_and_rebuilds_on_force(tmp_path, monkeypatch, capsys):
    """Every option the build paths read has its default (the worker's --quiet, --force)."""
    import agents.refmodels.__main__ as cli

    calls = []
    monkeypatch.setattr(cli, "build", lambda task, size, out, verbose: calls.append(
        ("build", task, size, verbose)))
    assert cli.main(["--worker", "sentiment", "tiny", str(tmp_path)]) == 0
    assert cli.main(["--worker", "sentiment", "tiny", str(tmp_path), "--quiet"]) == 0
    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps({"task": "sentiment"}))
    monkeypatch.setattr(cli, "rebuild", lambda task, size: calls.append(("rebuild", task))
                        or folder)
    monkeypatch.setattr(cli, "reference_lm", lambda task, size: calls.append(("cached", task))
                        or folder)
    assert cli.main(["--tasks", "sentiment", "--size", "tiny", "--force"]) == 0
    assert cli.main(["--tasks", "sentiment", "--size", "tiny"]) == 0
    assert calls == [("build", "sentiment", "tiny", True), ("build", "sentiment", "tiny", False),
                     ("rebuild", "sentiment"), ("cached", "sentiment")]
    assert "not measured yet" in capsys.readouterr().out
