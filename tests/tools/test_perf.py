"""tools/perf/perf.py's bookkeeping: figures over interleaved rounds, and its options."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "perf"))
import perf  # noqa: E402  (tools/perf/perf.py, a script, not a package)


def child(s, rss, rollout=0.1):
    """A child's result as perf.py's children print it."""
    return {"s_per_iter": s, "rollout_s": rollout, "update_s": s - rollout, "warmup_s": 1.0,
            "peak_rss_mb": rss}


def test_rounds_combine_to_medians_and_ratios_within_each_round():
    rounds = [{"ours": child(2.0, 500), "trl": child(10.0, 1000)},
              {"ours": child(3.0, 520), "trl": child(10.0, 1000)},  # a slow moment for ours
              {"ours": child(2.4, 510), "trl": child(8.0, 990)}]
    combined = perf.combine([r["ours"] for r in rounds])
    assert combined["s_per_iter"] == 2.4 and combined["peak_rss_mb"] == 520
    trl = perf.combine([{"s_per_iter": 9.0, "peak_rss_mb": 1000},  # TRL's children: no split
                        {"s_per_iter": 8.0, "peak_rss_mb": 990}, None])
    assert trl == {"s_per_iter": 8.5, "peak_rss_mb": 1000}
    # within-round ratios 0.2, 0.3, 0.3 -> 0.3; the ratio of medians would be 2.4 / 10 = 0.24
    assert perf.round_ratio(rounds, "ours", "trl") == 0.3
    assert perf.round_ratio(rounds, "ours", "trl", "peak_rss_mb") == 0.515
    rounds[1]["trl"] = None  # a failed child drops out of its round only
    assert perf.round_ratio(rounds, "ours", "trl") == 0.25
    assert perf.combine([None, None]) is None
    assert perf.round_ratio([{"ours": None, "trl": child(1, 1)}], "ours", "trl") is None


def test_rounds_must_be_positive(capsys):
    assert perf.parse_args(["--rounds", "3"]).rounds == 3
    with pytest.raises(SystemExit):
        perf.parse_args(["--rounds", "0"])
    assert "--rounds must be a positive integer, got 0" in capsys.readouterr().err


def test_main_prints_within_round_ratios_with_stub_children(monkeypatch, capsys):
    """The summary JSON line from stubbed children: ours and TRL's, over two rounds."""
    import json
    import sys

    times = iter([2.0, 3.0])  # our fast CORY child: round 1, round 2

    def ours(args, method, resp=16, iters=None, lora=False, precision=None,
             max_tokens_per_pass=None, old_logprobs="auto", torch_compile=False):
        fast = precision == "bf16" and method == "cory" and not torch_compile
        return child(next(times) if fast else 4.0, 600)

    monkeypatch.setattr(perf, "run_ours", ours)
    monkeypatch.setattr(perf, "run_trl", lambda args, mode: {"s_per_iter": 10.0 if mode == "cory"
                                                             else 3.0, "peak_rss_mb": 1000})
    monkeypatch.setattr(perf, "ensure_model", lambda path, python: None)
    monkeypatch.setattr(perf, "aec_steps_per_s", lambda task, n: 1.0)
    monkeypatch.setattr(perf, "batched_env_overhead", lambda model, rounds: {
        "frac_of_step": 0.03, "frac_of_forward": 0.03})
    threads = torch.get_num_threads()
    try:
        perf.main(["--rounds", "2", "--fast", "--compiled", "--lora", "--lean", "--skip-length",
                   "--threads", "1", "--trl-python", sys.executable])
    finally:
        torch.set_num_threads(threads)  # main sets this process' threads
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["rounds"] == 2 and summary["trl_cory_s_per_iter"] == 10.0
    assert summary["cory_fast_s_per_iter"] == 2.5 and summary["cory_fast_over_trl_cory"] == 0.25
    assert summary["cory_over_trl_cory_by_round"]["cory_fast"] == [0.2, 0.3]
    assert summary["cory_compiled_over_trl_cory"] == 0.4 and summary["cory_lean_peak_rss_mb"] == 600
    assert summary["cory_rss_over_trl_cory"] == 0.6 and summary["ppo_over_trl_ppo"] == 1.333
