"""agents: LLM policies as MARL agents, token-level PPO, and the swappable learners.

One room per job (imports flow downward: distributed, interop → training → learners → llm →
cory_env; `tests/test_architecture.py` checks it):

- `agents.llm`: an LLM as a policy (the model, sampling, KV cache, speed settings, loading,
  and the one decode loop).
- `agents.learners`: how policies learn (algorithms and their registry, structures with CORY's
  among them, the PPO maths, the KL and reward shaping).
- `agents.training`: running training (the config, the trainer, checkpoints and restoring a
  saved run, the run log, command-line options and statistics over seeds).
- `agents.distributed`: the same training over processes (DDP, FSDP2).
- `agents.refmodels`: the offline reference models (built below training) and the mechanism
  measurement (which trains, so above it).
- `agents.interop`: other libraries' interfaces (Tianshou).
- `agents.play`: watch a model play the env (`python -m agents.play`).

`MOVED` maps the flat module paths of earlier versions (`agents.train`, `agents.ppo`, ...) to
their rooms, so old imports keep working.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {f"agents.{old}": f"agents.{new}" for old, new in {
    "policy": "llm.policy", "sampling": "llm.sampling", "kvcache": "llm.kvcache",
    "speed": "llm.speed", "loading": "llm.loading", "rollout": "llm.rollout",
    "learner": "learners.base", "ppo": "learners.ppo", "shaping": "learners.shaping",
    "metrics": "learners.metrics", "cory": "learners.cory", "group": "learners.group",
    "grpo": "learners.grpo", "dr_grpo": "learners.dr_grpo", "rloo": "learners.rloo",
    "reinforce": "learners.reinforce", "reinforce_pp": "learners.reinforce_pp",
    "mappo": "learners.mappo", "arms": "learners.arms", "comm": "learners.comm",
    "train": "training.train", "checkpoint": "training.checkpoint",
    "runlog": "training.runlog", "cli": "training.cli", "stats": "training.stats",
    "tianshou_adapter": "interop.tianshou"}.items()}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves a moved module path to the module at its new home (the same object)."""

    def find_spec(self, name, path=None, target=None):
        """A spec for a moved name, else None."""
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        """The module at the new path."""
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        """Nothing: the module ran at its new path."""


if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.append(_Moved())
