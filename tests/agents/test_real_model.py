"""Training a GGUF model (a tiny random Llama written by the test) on the real-reward tasks:
the KL of an untrained policy is exactly 0 in every precision, the benchmark and the
mechanism measurement take it like any model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import write_tiny_gemma3_gguf, write_tiny_gguf

from agents.learners.ppo_config import PPOConfig
from agents.llm.loading import LoraSettings
from agents.training.config import TrainConfig
from agents.training.train import Trainer


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    """Gemma 3's layout: a tokenizer that adds BOS, tied embeddings, q/k norms, sliding
    windows."""
    return write_tiny_gemma3_gguf(tmp_path_factory.mktemp("gemma") / "tiny-gemma3.gguf")


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CORY_CACHE", str(tmp_path_factory.getbasetemp() / "gguf-cache"))


def _cfg(model, **kw) -> TrainConfig:
    base = dict(task="reviews", method="cory", model=model, iterations=2, batch_size=4,
                max_new_tokens=6, ppo=PPOConfig(lr=1e-3, mini_batch_size=4))
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("lora, precision", [(True, "bf16"), (False, "bf16"), (False, None),
                                             (True, None)])
def test_an_untrained_policy_has_exactly_zero_kl(tiny_gguf, lora, precision):
    """LoRA + CPU bf16 gave 0.012-0.014 nats: decoding and the reference pass rounded apart."""
    trainer = Trainer(_cfg(tiny_gguf, lora=LoraSettings(r=4) if lora else None,
                           mixed_precision=precision))
    first = trainer.step()
    for agent in ("llm_0", "llm_1"):  # bf16: one full pass each, the same bits; fp32: rounding
        assert first[agent]["kl"] == 0.0 if precision else abs(first[agent]["kl"]) < 1e-5
    second = trainer.step()
    assert second["llm_0"]["kl"] > 0  # it moved


def test_a_gguf_model_trains_on_reasoning_and_resumes_bit_for_bit(tiny_gguf, tmp_path):
    cfg = _cfg(tiny_gguf, task="reasoning", task_options={"n_queries": 32}, iterations=3)
    a = Trainer(cfg)
    [a.step() for _ in range(2)]
    a.save(str(tmp_path / "ckpt.pt"))
    last = a.step()
    b = Trainer(cfg)
    b.load(str(tmp_path / "ckpt.pt"))
    again = b.step()
    assert last["llm_0"]["loss"] == again["llm_0"]["loss"]
    assert b.env.task.tokenizer is b.env.tokenizer  # the task cut its queries with the model's


@pytest.mark.slow
def test_the_benchmark_runs_a_gguf_model_on_reviews_and_library_tasks(tiny_gguf, tmp_path):
    from benchmarks.run import main

    out = tmp_path / "run"
    main(["--model", tiny_gguf, "--tasks", "reviews,reasoning,textarena", "--methods", "ppo,cory",
          "--quick", "--max-new-tokens", "6", "--out", str(out), "--no-progress"])
    evals = [json.loads(x) for x in (out / "alone.jsonl").read_text().splitlines()]
    assert {e["task"] for e in evals} == {"reviews", "reasoning", "textarena"}
    assert all("pass@1" in e for e in evals if e["task"] != "reviews")  # exact match
    assert not any("pass@1" in e for e in evals if e["task"] == "reviews")
    report = (out / "report.md").read_text()
    assert "reasoning" in report and "reviews" in report and "textarena" in report


@pytest.mark.slow
@pytest.mark.parametrize("which", ["tiny_gguf", "tiny_gemma"])
def test_measure_takes_any_model_task_and_training_setting(which, request, tmp_path, capsys):
    from benchmarks.mechanism.cli import main

    tiny_gguf = request.getfixturevalue(which)
    out = tmp_path / "transfer.json"
    torch.manual_seed(0)
    assert main(["--measure", "reviews", "--model", tiny_gguf, "--iterations", "1",
                 "--batch-size", "4", "--max-new-tokens", "4", "--seeds", "0", "--queries", "4",
                 "--lora", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["budget"]["iterations"] == 1 and result["budget"]["lora"]
    assert result["model"] == tiny_gguf and result["verdict"] in ("undefined", "absent")
    assert "Cross-role transfer" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--measure", "reviews"])  # no offline LM: --model is needed


def test_play_shows_both_roles_and_scores_a_model_alone(tiny_gguf, capsys):
    from agents.play import main

    assert main(["--model", tiny_gguf, "--task", "reviews", "--episodes", "2",
                 "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert out.count("pioneer:") == 2 and out.count("observer:") == 2 and "query:" in out
    assert main(["--model", tiny_gguf, "--task", "reasoning", "--alone", "3", "--samples", "2",
                 "--max-new-tokens", "4", "--task-options", "n_queries=64"]) == 0
    assert "held-out reasoning queries x 2 samples: pass@1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--task", "reasoning", "--task-options", "dataset=nope"])
    assert main(["--model", tiny_gguf, "--task", "reviews", "--episodes", "2", "--rounds", "2",
                 "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out  # round 1's two answers, then round 2's with rewards
    assert out.count("(round 1)") == 4 and out.count("reward") == 4


@pytest.mark.parametrize("lora, precision", [(True, "bf16"), (False, None)])
def test_a_gemma3_model_trains_with_cory_and_its_bos(tiny_gemma, lora, precision):
    trainer = Trainer(_cfg(tiny_gemma, lora=LoraSettings(r=4) if lora else None,
                           mixed_precision=precision))
    first = trainer.step()
    for agent in ("llm_0", "llm_1"):
        assert first[agent]["kl"] == 0.0 if precision else abs(first[agent]["kl"]) < 1e-5
    assert trainer.step()["llm_0"]["kl"] > 0
    bos = trainer.env.tokenizer.bos_token_id
    ids, mask = trainer.env.episodes.ids, trainer.env.episodes.mask
    starts = mask.argmax(axis=-1)  # every prompt row of every position begins with one BOS
    assert all(ids[k, i, starts[k, i]] == bos for k in range(2) for i in range(ids.shape[1]))


def test_play_and_the_text_view_speak_through_a_gemma3_model(tiny_gemma, capsys):
    from agents.play import main

    assert main(["--model", tiny_gemma, "--task", "reviews", "--episodes", "1",
                 "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "pioneer:" in out and "observer:" in out


def test_play_refuses_a_zero_cap_in_one_line(capsys):
    from agents.play import main

    with pytest.raises(SystemExit):
        main(["--max-new-tokens", "0"])
    err = capsys.readouterr().err
    assert "--max-new-tokens must be positive, got 0" in err and "Traceback" not in err


def test_alone_answers_are_scored_in_length_order_with_the_rollouts_numbers(tiny_gguf):
    """A bf16 policy's alone answers on the exact decode path are scored after decoding, every
    batch together in order of prompt length: the same rewards as each batch's own rollout,
    the same KLs to bf16 rounding, exactly 0 before training; `kl=False` skips the passes."""
    import numpy as np

    from agents.llm.rollout import answer_alone, rollout
    from cory_env import BatchedCoryEnv

    trainer = Trainer(_cfg(tiny_gguf, method="ppo", lora=LoraSettings(r=4), decode="exact",
                           mixed_precision="bf16", ppo=PPOConfig(lr=3e-3, mini_batch_size=4)))
    policy, sampling = trainer.learner.policies["llm_0"], trainer.cfg.sampling
    env = BatchedCoryEnv(batch_size=8, task=trainer.env.task, tokenizer=trainer.env.tokenizer,
                         max_new_tokens=6, split="test", n_agents=1, seed=0)
    queries = list(range(20))  # 8 + 8 + 4: the last batch padded with its last query

    def gen():
        return torch.Generator().manual_seed(5)

    assert np.all(answer_alone(env, policy, sampling, gen(), queries)[1] == 0)
    for _ in range(3):
        trainer.step()
    rewards, kls = answer_alone(env, policy, sampling, gen(), queries)
    g, each = gen(), []
    for i in range(0, len(queries), 8):
        chunk = queries[i:i + 8]
        turn = rollout(env, {"llm_0": policy}, sampling, g,
                       reset_options={"queries": chunk + [chunk[-1]] * (8 - len(chunk))})
        each.append((turn["llm_0"].task_reward[:len(chunk)].numpy(),
                     turn["llm_0"].full_kl.sum(1)[:len(chunk)].numpy()))
    assert len(rewards) == len(kls) == 20
    assert np.array_equal(rewards, np.concatenate([r for r, _ in each]))
    batch_kls = np.concatenate([k for _, k in each])
    assert kls.mean() > 0
    np.testing.assert_allclose(kls, batch_kls, rtol=0.05, atol=0.02)
    again, none = answer_alone(env, policy, sampling, gen(), queries, kl=False)
    assert none is None and np.array_equal(again, rewards)


@pytest.mark.slow
def test_the_benchmark_trains_a_two_player_game_over_rounds(tiny_gguf, tmp_path):
    """ippo, cory and cory-individual on TicTacToe (5 rounds), each side's own outcome."""
    from benchmarks.run import main

    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="zero-sum"):  # cory's collective reward pays 0
        main(["--model", tiny_gguf, "--tasks", "game", "--methods", "ippo,cory,cory-individual",
              "--rounds", "5", "--quick", "--iterations", "2", "--batch-size", "4",
              "--max-new-tokens", "4", "--out", str(out), "--no-progress"])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    games = {r["method"]: r for r in rows if r.get("role") == "pioneer"}
    assert set(games) == {"ippo", "cory", "cory-individual"}
    # a random tiny model's answers are no moves: each game is lost on the pioneer's first
    # move, so the episodes end after one turn; the observer said nothing and won
    assert all(r["task_reward"] == -1 and np.isfinite(r["loss"]) for r in games.values())
    observers = [r for r in rows if r.get("role") == "observer"]
    assert len(observers) == 6 and all(r["task_reward"] == 1 and r["loss"] == 0
                                       for r in observers)
    assert all(r["collective_reward"] == 0 for r in rows if "collective_reward" in r)
    assert "With 5 rounds the claims" in (out / "report.md").read_text()
