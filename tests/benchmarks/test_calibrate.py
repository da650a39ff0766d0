"""The claims' false-verdict rates, measured on synthetic runs whose truth is known."""

from __future__ import annotations

import math

import pytest

from benchmarks import calibrate as cb
from benchmarks.evidence import verdicts as vd

REPLICATES = 40  # a Monte Carlo standard error of 2.5 points at a 2.5% rate
BOUND = 0.025 + 3 * math.sqrt(0.025 * 0.975 / REPLICATES)  # nominal plus three errors


@pytest.mark.parametrize("name", ["one frontier", "identical methods", "no learning"])
def test_no_null_world_gives_false_verdicts_above_their_bound(name):
    (world,) = [w for w in cb.WORLDS if w.name.startswith(name)]
    assert world.null
    rates = cb.rates(world, seeds=5, replicates=REPLICATES, seed=1)
    assert cb.worst({(name, 5): rates}) <= BOUND, cb.table({(name, 5): rates}, REPLICATES)


def test_the_worlds_truths_are_what_they_were_built_to_be():
    by = {w.name: cb.truths(w) for w in cb.WORLDS}
    assert by["identical methods"]["(1b)"] == "boundary" == by["identical methods"]["(3)"]
    assert by["CORY 2x KL-efficient"]["(1a)"] == "boundary"
    assert by["CORY 3x, ablations 1.5x"]["(1a)"] == "true" == by["CORY 3x, ablations 1.5x"]["(3)"]
    assert by["PPO collapses by 0.4"]["(2)"] == "true"
    assert by["one frontier, CORY at half PPO's speed"]["(4)"] == "false"
    assert set(by["no learning"].values()) == {"untestable"}


def test_a_strong_alternative_is_found_and_the_rates_are_reproducible():
    world = next(w for w in cb.WORLDS if w.name.startswith("CORY 3x"))
    a = cb.rates(world, seeds=5, replicates=10, seed=3)
    assert a == cb.rates(world, seeds=5, replicates=10, seed=3)  # seeded
    assert a["(3)"]["supported"] >= 0.8 and a["(1b)"]["supported"] >= 0.5


def test_a_written_replicate_is_a_run_folder_the_report_reads(tmp_path):
    import numpy as np

    from benchmarks.report.markdown import write_report

    cb.write_folder(tmp_path, cb.records(cb.WORLDS[0], 3, np.random.default_rng(0)))
    text = write_report(tmp_path).read_text()
    assert "(1b) at matched KL" in text and vd.INCONCLUSIVE in text


def test_the_command_refuses_bad_settings_by_name(capsys):
    for argv, word in ((["--seeds", "3,x"], "'3,x'"), (["--replicates", "0"], "at least 1"),
                       (["--worlds", "nowhere"], "'nowhere'")):
        with pytest.raises(SystemExit):
            cb.main(argv)
        assert word in capsys.readouterr().err
