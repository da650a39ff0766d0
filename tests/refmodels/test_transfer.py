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
from agents.ppo import PPOConfig
from agents.refmodels import transfer as tr
from agents.train import TrainConfig

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


def test_a_model_that_ignores_the_answer_gets_nothing_from_it():
    r = tr.knowledge_transfer(Scripted(copy=False), ToyTask(), max_new_tokens=4, n=5)
    assert r["from_answer"]["mean"] == 0 and r["from_instruction"]["mean"] == 0
    result = {"knowledge_transfer": r, "cross_role": {"ratio": {"mean": 0.9},
                                                      "per_seed": [{"ratio": 0.9}]}}
    assert tr.verdict(result) == "absent"  # the answer is worth nothing


def test_verdict_reads_the_cross_role_ratio_and_its_worst_seed():
    answer = {"mean": 0.5, "low": 0.2, "high": 0.8, "n": 3, "detectable": 0.3}

    def result(ratios):
        return {"knowledge_transfer": {"from_answer": answer},
                "cross_role": {"ratio": {"mean": sum(ratios) / len(ratios)},
                               "per_seed": [{"ratio": x} for x in ratios]}}

    assert tr.verdict(result([0.6, 0.7, 0.5])) == "present"
    assert tr.verdict(result([0.9, 0.9, 0.2])) == "weak"  # one seed below 0.3
    assert tr.verdict(result([0.1, 0.2, 0.15])) == "absent"
    flat = result([0.6, 0.7, 0.5])
    flat["cross_role"]["gain_alone_ppo"] = {"mean": 0.01, "low": -0.02, "high": 0.04, "n": 3,
                                            "detectable": 0.03}
    assert tr.verdict(flat) == "undefined"  # PPO learnt nothing: no skill to carry over
    assert "cannot be tested" in tr.MEANING["absent"]


def test_measure_transfer_trains_both_methods_and_saves_the_ratios(toy_lm, tmp_path):
    model = shutil.copytree(toy_lm, tmp_path / "lm")
    (model / "report.json").write_text('{"task": "toy"}')  # a build report to extend
    cfg = TrainConfig(iterations=2, batch_size=4, max_new_tokens=4,
                      ppo=PPOConfig(batch_size=4, mini_batch_size=4, lr=3e-3, ppo_epochs=1))
    r = tr.measure_transfer("toy", str(model), cfg, seeds=(0, 1), n=5, progress=lambda m: None)
    saved = json.loads((model / "transfer.json").read_text())
    report = json.loads((model / "report.json").read_text())
    assert report["task"] == "toy" and report["transfer"] == saved
    assert saved["verdict"] == r["verdict"] in tr.MEANING
    assert len(r["cross_role"]["per_seed"]) == 2 and r["budget"]["iterations"] == 2
    for row in r["cross_role"]["per_seed"]:
        den = row["alone_ppo"] - row["alone_base"]
        expected = (row["alone_observer_only"] - row["alone_base"]) / den if den > 0 else math.nan
        assert row["ratio"] == pytest.approx(expected, nan_ok=True)
    assert tr.saved_transfer(model) == saved
    lines = tr.format_transfer(r)
    assert "Cross-role transfer" in lines[1] and "reverse" in lines[2] and "Verdict" in lines[3]


def test_measure_command_rejects_bad_input_before_building(capsys):
    from agents.refmodels.__main__ import main

    for argv, message in ((["--measure", "nosuch"], "unknown task 'nosuch'"),
                          (["--measure", "sentiment", "--seeds", "a,b"], "--seeds must be")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err


def test_the_command_builds_quietly_and_rebuilds_on_force(tmp_path, monkeypatch, capsys):
    """Every option the build paths read has its default (the worker's --quiet, --force)."""
    import agents.refmodels.__main__ as cli

    calls = []
    monkeypatch.setattr(cli, "build", lambda task, budget, out, verbose: calls.append(
        ("build", task, budget, verbose)))
    assert cli.main(["--worker", "sentiment", "tiny", str(tmp_path)]) == 0
    assert cli.main(["--worker", "sentiment", "tiny", str(tmp_path), "--quiet"]) == 0
    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps({"task": "sentiment"}))
    monkeypatch.setattr(cli, "rebuild", lambda task, budget: calls.append(("rebuild", task))
                        or folder)
    monkeypatch.setattr(cli, "reference_lm", lambda task, budget: calls.append(("cached", task))
                        or folder)
    assert cli.main(["--tasks", "sentiment", "--budget", "tiny", "--force"]) == 0
    assert cli.main(["--tasks", "sentiment", "--budget", "tiny"]) == 0
    assert calls == [("build", "sentiment", "tiny", True), ("build", "sentiment", "tiny", False),
                     ("rebuild", "sentiment"), ("cached", "sentiment")]
    assert "not measured yet" in capsys.readouterr().out
