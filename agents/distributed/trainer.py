"""`DistributedTrainer`: one rank of a torchrun / accelerate launch (DDP or FSDP2).

Each rank builds the same models under the same seed and hands its learner a `DDPComm` or
`FSDPComm` (`comm.py`); rollouts are local. Data: with N ranks, iteration i's N*B queries are
consecutive positions of a per-epoch permutation of the task's queries shared by all ranks;
rank r takes the r-th block of B, so ranks see disjoint prompts (like `DistributedSampler`).
The sampling generator is seeded per rank. With one process nothing changes: a
`DistributedTrainer` equals a `Trainer`. Metrics are all-gathered and averaged (timings: the
slowest rank); checkpoints are written by rank 0 and hold every rank's RNG states.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..training.checkpoint import atomic_save, load_trainer_state, read_checkpoint, trainer_state
from ..training.config import TrainConfig
from ..training.train import Trainer
from .fsdp import full_state, gathered, shard_optimizer_state
from .ranks import DDPComm, FSDPComm, SyncedPolicy

SUPPORTED = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_MUSA",
             "MULTI_HPU", "MULTI_SDAA")


def make_accelerator(cpu: bool | None = None, mixed_precision: str | None = None):
    """An `accelerate.Accelerator`; cpu=None means "CPU when no CUDA GPU is visible"."""
    from accelerate import Accelerator

    if cpu is None:
        cpu = not torch.cuda.is_available()
    return Accelerator(cpu=cpu, mixed_precision=mixed_precision)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of a rank's sampling generator: `seed` on rank 0, a derived one elsewhere."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1, np.uint64)[0] >> 1)


@dataclass
class ShardedQueries:
    """Query indices of (iteration, rank): disjoint blocks of a per-epoch shared permutation."""

    n_queries: int
    batch_size: int
    rank: int
    world_size: int
    seed: int = 0

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of all queries in one pass over the pool (same on every rank)."""
        return np.random.default_rng([self.seed, epoch]).permutation(self.n_queries)

    def __call__(self, iteration: int) -> list[int]:
        """This rank's B query indices for the iteration."""
        start = (iteration * self.world_size + self.rank) * self.batch_size
        out, perms = [], {}
        for pos in range(start, start + self.batch_size):
            epoch = pos // self.n_queries
            if epoch not in perms:
                perms[epoch] = self.permutation(epoch)
            out.append(int(perms[epoch][pos % self.n_queries]))
        return out


def check_single_process_options(cfg: TrainConfig) -> None:
    """Refuse a token cap on passes (ranks would run different numbers of backward passes) and
    compiled training passes (not tested under DDP/FSDP hooks), before any model loads."""
    if cfg.ppo.max_tokens_per_pass is not None:
        raise ValueError(f"ppo.max_tokens_per_pass={cfg.ppo.max_tokens_per_pass} is "
                         "single-process only; use mini_batch_size and grad_accum_steps across "
                         "processes")
    if cfg.torch_compile:
        raise ValueError("torch_compile=True is single-process only (untested with DDP/FSDP); "
                         "leave it False across processes")


def sharded_roots(learner) -> list[nn.Module]:
    """The FSDP root module of every agent and of the learner's own models (MAPPO's critic),
    and the shared reference."""
    roots = [a.policy.wrapped for a in learner.agents.values()]
    roots += list({id(p.ref_model): p.ref_model for p in learner.policies.values()
                   if getattr(p, "ref_model", None) is not None}.values())
    roots += [m.wrapped for m in learner.extra_models().values() if isinstance(m, SyncedPolicy)]
    return roots


def reduce_metrics(per_rank: list[dict]) -> dict:
    """Average numeric metrics over ranks (timings: the max); other values come from rank 0."""
    first = per_rank[0]
    out = {}
    for key, value in first.items():
        values = [m.get(key) for m in per_rank]
        if isinstance(value, dict):
            out[key] = reduce_metrics([v if isinstance(v, dict) else {} for v in values])
        elif isinstance(value, float) and all(isinstance(v, (int, float)) for v in values):
            out[key] = max(values) if key.startswith("time_") else \
                math.fsum(values) / len(values)
        else:
            out[key] = value
    return out


class DistributedTrainer(Trainer):
    """A Trainer for one rank of a torchrun / accelerate launch (see the module docstring).

    The device comes from the accelerator (`cfg.device` is replaced by it); per-agent
    `placement` is for a single process only (several GPUs, one process).
    """

    def __init__(self, cfg: TrainConfig, accelerator=None, env_options: dict | None = None,
                 sharding: str | None = None):
        accelerator = accelerator or make_accelerator()
        kind = accelerator.distributed_type.name
        if sharding is None:
            sharding = "fsdp" if kind == "FSDP" else "ddp"
        if sharding not in ("ddp", "fsdp"):
            raise ValueError(f"sharding must be 'ddp' or 'fsdp', got {sharding!r}")
        if sharding == "fsdp" and not torch.distributed.is_initialized():
            raise ValueError("sharding='fsdp' needs a process group: start the script with "
                             "torchrun or accelerate launch (even for one process)")
        if kind not in SUPPORTED + ("FSDP",):
            raise NotImplementedError(
                f"distributed_type={kind} is not supported by agents.distributed (DDP or FSDP: "
                f"`accelerate launch --multi_gpu`, `--use_fsdp`, or torchrun [--fsdp]). "
                f"DeepSpeed needs one engine per agent; see docs/scaling.md")
        if accelerator.mixed_precision == "fp16":
            raise ValueError("mixed_precision='fp16' is not supported (PPO clips unscaled "
                             "gradients); use 'bf16' or 'no'")
        if accelerator.num_processes > 1 and cfg.placement:
            raise ValueError(f"placement={cfg.placement!r} needs a single process; with "
                             f"{accelerator.num_processes} processes each rank uses its own "
                             f"device ({accelerator.device})")
        check_single_process_options(cfg)
        self.accelerator = accelerator
        self.rank, self.world_size = accelerator.process_index, accelerator.num_processes
        self.sharding = sharding
        self.comm = (FSDPComm if sharding == "fsdp" else DDPComm)(accelerator)
        super().__init__(dataclasses.replace(cfg, device=str(accelerator.device)), env_options,
                         comm=self.comm)
        if self.world_size > 1:
            self.learner.generator.manual_seed(rank_seed(self.cfg.seed, self.rank))
            pool = self.env.task.queries(self.env.config.split)
            per_rank = self.cfg.batch_size // self.learner.group  # distinct queries a rank
            self.query_sampler = ShardedQueries(len(pool), per_rank, self.rank,
                                                self.world_size, self.cfg.seed)
        self.local_metrics: dict | None = None

    def rollout_context(self):
        """Under FSDP, full parameters on every rank for the whole rollout (no collectives)."""
        if self.sharding != "fsdp":
            return super().rollout_context()

        return gathered(sharded_roots(self.learner))

    @property
    def is_main_process(self) -> bool:
        """True on rank 0 (the one that logs and writes checkpoints)."""
        return self.rank == 0

    def step(self) -> dict:
        """One iteration on every rank; returns metrics averaged over ranks (on every rank)."""
        self.local_metrics = super().step()
        metrics = reduce_metrics(self.comm.gather_object(self.local_metrics))
        metrics["world_size"] = self.world_size
        return metrics

    def _rank_state(self) -> dict:
        return {"generator": self.learner.generator.get_state(), "env_rng": self.env.rng_state(),
                "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
                "python_rng": random.getstate()}

    def save(self, path: str) -> None:
        """Checkpoint from rank 0 with every rank's RNG states (call it on all ranks).

        Under FSDP every rank takes part in gathering the full tensors; rank 0 writes them.
        """
        ranks = self.comm.gather_object(self._rank_state())
        state = None
        if self.sharding == "fsdp":

            state = full_state(trainer_state(self))
        if self.is_main_process:
            state = state or trainer_state(self)
            state.update(world_size=self.world_size, ranks=ranks)
            atomic_save(state, path)
        self.comm.barrier()

    def resume(self, path: str) -> bool:
        """Load `path` on every rank if rank 0 has it; False (a fresh start) if no rank has it.

        Ranks agree first: a rank that cannot see the file rank 0 wrote (no shared filesystem)
        fails with the ranks named, instead of training on from different weights.
        """
        seen = self.comm.gather_object(os.path.exists(path))
        if not any(seen):
            return False
        if not all(seen):
            missing = [r for r, ok in enumerate(seen) if not ok]
            raise FileNotFoundError(
                f"checkpoint {path} exists on rank(s) {[r for r, ok in enumerate(seen) if ok]} "
                f"but not on rank(s) {missing}: resuming needs the file on every rank (a shared "
                f"filesystem, or copy it to each node)")
        self.load(path)
        return True

    def load(self, path: str) -> None:
        """Resume on every rank; a rank missing from the checkpoint gets derived RNG seeds."""
        state = read_checkpoint(path)
        load_trainer_state(self, state, f"checkpoint {path}")
        if self.sharding == "fsdp":

            for agent in self.learner.agents.values():
                shard_optimizer_state(agent.optimizer)
            for optimizer in self.learner.extra_optimizers():
                shard_optimizer_state(optimizer)
        ranks = state.get("ranks", [])
        if self.rank < len(ranks):
            own = ranks[self.rank]
            self.learner.generator.set_state(own["generator"])
            self.env.set_rng_state(own["env_rng"])
            torch.set_rng_state(own["torch_rng"])
            np.random.set_state(own["numpy_rng"])
            random.setstate(own["python_rng"])
        elif self.rank > 0:
            warnings.warn(f"checkpoint {path} has no RNG state for rank {self.rank} (saved with "
                          f"{len(ranks) or 1} processes); reseeding it", RuntimeWarning,
                          stacklevel=2)
            self.learner.generator.manual_seed(rank_seed(self.cfg.seed + self.iteration,
                                                         self.rank))


