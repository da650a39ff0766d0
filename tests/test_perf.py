"""benchmarks/perf.py's bookkeeping: figures over interleaved rounds, and its options."""

import pytest

from benchmarks import perf


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
