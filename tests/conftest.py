"""Fixtures shared by every test folder; the helpers themselves are in `helpers.py`."""

from __future__ import annotations

import os

# Ray, wherever a test starts it: no usage report off the machine, nodes on loopback only
# (read when ray is first imported, so set before any test module can import it)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest  # noqa: E402
import torch
from helpers import ToyTask, save_toy_lm

torch.set_num_threads(1)  # tiny models: one thread is fastest and robust to a busy machine


@pytest.fixture
def toy_task():
    return ToyTask()


@pytest.fixture(scope="session")
def toy_lm(tmp_path_factory):
    """The tiny toy GPT-2 folder, built once per test session."""
    return save_toy_lm(tmp_path_factory.mktemp("toylm"))
