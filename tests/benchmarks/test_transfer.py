"""The mechanism measurement on models whose answer is known by construction."""

from __future__ import annotations

import json
import math
import shutil
from types import SimpleNamespace

import pytest
import torch
from helpers import ToyTask

import cory_env
from agents.learners.ppo_config import PPOConfig
from agents.training.config import TrainConfig
from benchmarks.evidence import transfer as rd
from benchmarks.mechanism import measure as tr

cory_env.register_task("toy", ToyTask)


class Scripted:
    """A policy that plays a fixed rule: as pioneer it writes "good"; as observer (prompt with
    "more positive") it writes one "good" per "good" it can see (`copy=True`) or just "good"."""

    device = torch.device("cpu")

    def __init__(self, copy: bool):
        tok = ToyTask().tokenizer
        self.good, self.more, self.eos = (tok.convert_tokens_to_ids(w) for w in
                                          ("good", "more", "<eos>"))
        self.copy = copy

    def begin(self, ids, mask, sampling=None, max_new_tokens=None, repeat=1):
        plans = []
        for row, m in zip(ids.repeat_interleave(repeat, 0), mask.repeat_interleave(repeat, 0)):
            prompt = row[m.bool()].tolist()
            observer = self.more in prompt
            n = prompt.count(self.good) if self.copy and observer else 1
            plans.append([self.good] * n)
        return {"plans": plans, "t": 0}

    def sample(self, state, generator=None):
        t = state["t"]
        return SimpleNamespace(token=torch.tensor([p[t] if t < len(p) else self.eos
                                                   for p in state["plans"]]))

    def feed(self, state, token, active):
        state["t"] += 1


def test_a_model_that_copies_the_answer_gets_all_its_gain_from_the_answer():
    r = tr.knowledge_transfer(Scripted(copy=True), ToyTask(), max_new_tokens=4, n=5)
    # full prompt: copies the pioneer's "good" -> 1; empty answer: nothing to copy -> 0;
    # plain prompt: answers as a pioneer -> 1
    assert r["per_seed"] == {"full": [1.0] * 3, "empty_answer": [0.0] * 3, "plain": [1.0] * 3}
    assert r["from_answer"]["mean"] == 1 and r["from_answer"]["low"] == 1
    assert r["from_instruction"]["mean"] == -1 and r["total"]["mean"] == 0


def test_more_answers_than_held_out_queries_cycle_over_the_split():
    """A split of 5 queries measured with 12 answers: each query again, in order (a task like
    `reasoning` holds out fewer problems than a measurement's answers)."""
    env = tr._env(ToyTask(), ToyTask().tokenizer, 4, 12)
    assert tr.held_out(env, 12) == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]
    assert tr.held_out(env, 3) == [0, 1, 2]
    r = tr.knowledge_transfer(Scripted(copy=True), ToyTask(), max_new_tokens=4, n=12)
    assert r["per_seed"] == {"full": [1.0] * 3, "empty_answer": [0.0] * 3, "plain": [1.0] * 3}


def test_a_model_that_ignores_the_answer_gets_nothing_from_it():
    r = tr.knowledge_transfer(Scripted(copy=False), ToyTask(), max_new_tokens=4, n=5)
    assert r["from_answer"]["mean"] == 0 and r["from_instruction"]["mean"] == 0


def rows(ppo_gains, observer_gains):
    """Per-seed rows of a cross-role measurement from the alone gains (base 0)."""
    return [{"alone_base": 0.0, "alone_ppo": p, "alone_observer_only": o, "observer_base": 0.0,
             "observer_pioneer_only": 1.0, "observer_observer_only": 1.0}
            for p, o in zip(ppo_gains, observer_gains)]


def summary(ppo_gains, observer_gains):
    """The summarised measurement of those rows."""
    return rd.summarize({"cross_role": {"per_seed": rows(ppo_gains, observer_gains)}})


def test_the_verdict_reads_the_interval_of_the_ratio_of_mean_gains():
    assert summary([1.0, 1.1, 0.9], [0.6, 0.72, 0.55])["verdict"] == "present"
    assert summary([1.0, 1.1, 0.9], [0.05, 0.1, 0.08])["verdict"] == "absent"
    assert summary([1.0, 1.1, 0.9], [0.41, 0.43, 0.37])["verdict"] == "weak"
    # a point estimate of 0.087 whose interval reaches past 0.3 is not "absent"
    wide = summary([1.0, 1.2, 0.8, 1.1, 0.9], [-0.25, 0.43, 0.1, 0.3, -0.15])
    assert wide["ratio"]["high"] > rd.WEAK and wide["verdict"] == "inconclusive"
    flat = summary([0.01, -0.02, 0.04], [0.6, 0.7, 0.5])
    assert flat["verdict"] == "undefined"  # PPO learnt nothing: no skill to carry over
    assert "still tested" in rd.MEANING["absent"]  # the claims are outcomes; it explains them


def test_a_small_positive_denominator_gives_an_unbounded_ratio_not_an_explosion():
    # the per-seed ratios would be 0.9/0.05 = 18 and 0.2/1.5 etc.: a mean of ratios explodes
    s = summary([0.05, 1.5, -0.4], [0.9, 0.2, 0.3])
    assert not s["ratio"]["bounded"] and s["verdict"] == "undefined"
    assert "unbounded" in s["ratio_text"]
    # every seed counts, including one whose own denominator is <= 0
    s = summary([1.0, 1.2, -0.1, 1.1], [0.5, 0.6, 0.3, 0.5])
    assert s["ratio"]["n"] == 4 and s["ratio"]["value"] == pytest.approx(1.9 / 3.2)


def test_fieller_matches_a_hand_computed_interval():
    from benchmarks.evidence.intervals import ratio_interval, t_quantile

    a, b = [1.0, 2.0, 3.0], [2.0, 2.0, 2.0]  # the denominator has no spread: a/2's interval
    r = ratio_interval(a, b)
    half = t_quantile(2) * 1 / math.sqrt(3) / 2
    assert r.value == 1 and r.low == pytest.approx(1 - half) and r.high == pytest.approx(1 + half)


def test_measure_transfer_trains_both_methods_and_saves_the_ratios(toy_lm, tmp_path):
    model = shutil.copytree(toy_lm, tmp_path / "lm")
    (model / "report.json").write_text('{"task": "toy"}')  # a build report to extend
    cfg = TrainConfig(iterations=2, batch_size=4, max_new_tokens=4,
                      ppo=PPOConfig(mini_batch_size=4, lr=3e-3, ppo_epochs=1))
    r = tr.measure_transfer("toy", str(model), cfg, seeds=(0, 1), n=5, progress=lambda m: None)
    saved = json.loads((model / "transfer.json").read_text())
    report = json.loads((model / "report.json").read_text())
    assert report["task"] == "toy" and report["transfer"] == saved
    assert saved["verdict"] == r["verdict"] in rd.MEANING
    assert len(r["cross_role"]["per_seed"]) == 2 and r["budget"]["iterations"] == 2
    for row in r["cross_role"]["per_seed"]:
        den = row["alone_ppo"] - row["alone_base"]
        expected = (row["alone_observer_only"] - row["alone_base"]) / den if den > 0 else math.nan
        assert row["ratio"] == pytest.approx(expected, nan_ok=True)
    assert rd.saved_transfer(model) == saved
    lines = rd.format_transfer(r)
    assert "Cross-role transfer" in lines[1] and "reverse" in lines[2] and "Verdict" in lines[3]


def test_measure_command_rejects_bad_input_before_building(capsys):
    from benchmarks.mechanism.cli import main

    for argv, message in ((["--measure", "nosuch"], "unknown task 'nosuch'"),
                          (["--measure", "sentiment", "--seeds", "a,b"], "--seeds must be")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err


def test_the_split_of_trained_models_is_read_from_their_checkpoints(toy_lm, tmp_path):
    """At iteration 0 a checkpoint holds the untrained model: the checkpoint measurement then
    equals the plain one with the partner as pioneer, seed for seed; a missing agent is named."""
    from agents.training.train import Trainer
    from benchmarks.mechanism.cli import main

    cfg = TrainConfig(task="toy", method="cory", model=str(toy_lm), batch_size=8, iterations=2,
                      max_new_tokens=4, ppo=PPOConfig(mini_batch_size=8))
    trainer = Trainer(cfg)
    trainer.save(str(tmp_path / "start.pt"))
    pol = trainer.learner.policies
    plain = tr.knowledge_transfer(pol["llm_1"], trainer.env.task, max_new_tokens=4, seeds=[0, 1],
                                  n=4, pioneer=pol["llm_0"])
    for _ in trainer.run():
        pass
    trainer.save(str(tmp_path / "end.pt"))
    paths = [str(tmp_path / "start.pt")] * 2
    got = tr.checkpoint_knowledge_transfer(paths, "llm_1", "llm_0", n=4)
    assert got["per_seed"] == plain["per_seed"] and got["iterations"] == [0, 0]
    assert got["from_answer"] == plain["from_answer"]
    out = tmp_path / "kt.json"
    assert main(["--checkpoint", f"{paths[0]},{tmp_path / 'end.pt'}", "--queries", "4",
                 "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["iterations"] == [0, 2] and saved["observer"] == "llm_1"
    assert set(saved["from_instruction"]) >= {"mean", "low", "high"}
    with pytest.raises(ValueError, match="has no agent 'llm_7'"):
        tr.checkpoint_knowledge_transfer(paths[:1], "llm_7", "llm_0", n=4)
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(tmp_path / "nowhere.pt")])


def test_cross_role_transfer_from_finished_runs_equals_training_them_here(toy_lm, tmp_path):
    """The same runs trained by the measurement or read from their checkpoints give the same
    figures, seed for seed; checkpoints of the wrong method, an unfinished run or unpaired
    seeds are refused by name."""
    from dataclasses import replace

    from agents.training.train import Trainer
    from benchmarks.mechanism.cli import main

    model = shutil.copytree(toy_lm, tmp_path / "lm")
    cfg = TrainConfig(task="toy", model=str(model), iterations=2, batch_size=4, max_new_tokens=4,
                      ppo=PPOConfig(mini_batch_size=4, lr=3e-3, ppo_epochs=1))
    paths = {}
    for method in ("ppo", "cory-no-re"):
        for seed in (0, 1):
            trainer = Trainer(replace(cfg, method=method, seed=seed))
            if method == "ppo" and seed == 1:
                trainer.save(str(tmp_path / "unfinished.pt"))
            for _ in trainer.run():
                pass
            paths[method, seed] = str(tmp_path / f"{method}-{seed}.pt")
            trainer.save(paths[method, seed])
    fresh = tr.measure_transfer("toy", str(model), cfg, seeds=(0, 1), n=5, save=False,
                                progress=lambda m: None)
    ppo, no_re = [paths["ppo", 1], paths["ppo", 0]], [paths["cory-no-re", 0],
                                                      paths["cory-no-re", 1]]
    read = tr.measure_transfer("toy", None, None, n=5, progress=lambda m: None,
                               out=str(tmp_path / "t.json"), checkpoints=(ppo, no_re))
    rows = [{k: v for k, v in r.items() if k != "checkpoints"}
            for r in read["cross_role"]["per_seed"]]
    assert rows == fresh["cross_role"]["per_seed"] and read["seeds"] == [0, 1]
    assert read["knowledge_transfer"] == fresh["knowledge_transfer"]
    assert read["verdict"] == fresh["verdict"] and read["budget"] == fresh["budget"]
    assert read["trained_from"][0] == [paths["ppo", 0], paths["cory-no-re", 0]]
    saved = json.loads((tmp_path / "t.json").read_text())["cross_role"]
    assert json.dumps(saved) == json.dumps(read["cross_role"])  # NaN != NaN: compare as text
    for bad, message in (((no_re, no_re), "method 'cory-no-re', not 'ppo'"),
                         ((ppo[:1], no_re), r"same seeds: PPO \[1\], cory-no-re \[0, 1\]"),
                         (([str(tmp_path / "unfinished.pt"), paths["ppo", 0]], no_re),
                          "at iteration 0 of 2: not a finished run")):
        with pytest.raises(ValueError, match=message):
            tr.measure_transfer("toy", None, None, n=5, save=False, checkpoints=bad)
    with pytest.raises(SystemExit):  # the command names the missing file before loading
        main(["--measure", "toy", "--ppo-checkpoints", str(tmp_path / "nowhere.pt"),
              "--observer-only-checkpoints", no_re[0]])
    _merged_seeds_equal_one_measurement(paths, read, tmp_path)


def _merged_seeds_equal_one_measurement(paths: dict, whole: dict, tmp_path) -> None:
    """Each seed measured on its own (as its runs finish), then merged, gives the measurement
    of both seeds at once; overlapping seeds and another budget are refused by name."""
    from benchmarks.mechanism.cli import main

    parts = {}
    for seed in (1, 0):
        parts[seed] = str(tmp_path / f"t{seed}.json")
        tr.measure_transfer("toy", None, None, n=5, progress=lambda m: None, out=parts[seed],
                            checkpoints=([paths["ppo", seed]], [paths["cory-no-re", seed]]))
    out = tmp_path / "merged.json"
    assert main(["--merge", f"{parts[1]},{parts[0]}", "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    for key in ("seeds", "budget", "knowledge_transfer", "cross_role", "trained_from",
                "verdict", "queries", "task"):
        assert json.dumps(merged[key]) == json.dumps(whole[key]), key  # NaN: compare as text
    assert merged["merged_from"] == [parts[1], parts[0]] and merged["file"] == str(out)
    spaced = tmp_path / "spaced.json"  # a space-separated list is the same list
    assert main(["--merge", parts[1], parts[0], "--out", str(spaced)]) == 0
    same = {**json.loads(spaced.read_text()), "file": str(out)}
    assert json.dumps(same) == json.dumps(merged)  # NaN != NaN: compare as text
    one = json.loads((tmp_path / "t0.json").read_text())
    with pytest.raises(ValueError, match="seed 0 is in both a and b"):
        rd.merge_transfers([one, one], ["a", "b"])
    other = {**one, "seeds": [1], "budget": {**one["budget"], "lr": 1.0}}
    with pytest.raises(ValueError, match="b has budget .*'lr': 1.0"):
        rd.merge_transfers([one, other], ["a", "b"])
    with pytest.raises(SystemExit):
        main(["--merge", parts[0]])  # no --out


def test_a_full_weight_bf16_policys_base_plays_as_the_untrained_policy_itself(toy_lm):
    """Every weight trained under bf16 stores the frozen reference in bf16: the base model
    measured from it runs at the policy's precision and answers as the untrained policy."""
    from agents.training.train import build_policies

    cfg = TrainConfig(task="toy", model=str(toy_lm), batch_size=4, max_new_tokens=4,
                      mixed_precision="bf16")
    policy = build_policies(cfg, ["llm_0"])["llm_0"]
    assert policy.ref_model is not None  # a frozen copy, not a LoRA adapter's base
    base = tr._frozen_copy(policy)
    assert base.mixed_precision == "bf16" and base is not policy
    envs = tr._cross_envs(ToyTask(), ToyTask().tokenizer, 4, 5)
    assert tr._alone(base, envs[0], 0, 5) == tr._alone(policy, envs[0], 0, 5)
    assert math.isfinite(tr._as_observer(base, base, envs[1], 0, 5))
