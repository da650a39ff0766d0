"""tools/perf/draws.py's measure of how far a sampler strays from the model's distribution."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "perf"))
import draws  # noqa: E402  (tools/perf/draws.py, a script, not a package)


def test_the_single_float32_sum_strays_and_the_two_level_draw_does_not():
    logits = torch.randn(8, 70000, generator=torch.Generator().manual_seed(0)) * 3
    logp = torch.log_softmax(logits, -1)
    tv_single, _ = draws.strays(logp, "single")
    tv_two, _ = draws.strays(logp, "two-level")
    assert tv_single > 1e-4  # a 70k-entry float32 running sum
    assert tv_two < 1e-6
    assert tv_two < tv_single / 100
