"""Multi-process training: every learner (CORY included) under DDP or FSDP2, a data shard per rank.

    torchrun --nproc_per_node 2 -m agents.distributed --task sentiment --method cory --cpu
    torchrun --nproc_per_node 2 -m agents.distributed --task sentiment --method cory --cpu --fsdp
    accelerate launch --multi_gpu --num_processes 4 -m agents.distributed --task imdb ...
    accelerate launch --config_file docs/accelerate/fsdp.yaml -m agents.distributed --task imdb

or from Python, inside a script started by torchrun / accelerate launch:

    trainer = DistributedTrainer(TrainConfig(task="sentiment", method="cory"))
    for metrics in trainer.run():          # metrics are averaged over ranks
        if trainer.is_main_process:
            print(metrics["llm_0"]["task_reward"])

Each rank holds full replicas of both agents (and the critic); rollouts are local. What is
synchronised, and how:

* weights: all ranks build the models under the same seed; each agent's PPO pass goes through
  its own DistributedDataParallel wrapper (`_Call` routes `policy.evaluate` through the wrapper's
  forward, so DDP sees the pass and all-reduces the gradients in backward). Only the agent's own
  trainable parameters are registered with DDP; frozen weights, the reference copy and the other
  LoRA adapter of a shared base are ignored, so a shared-LoRA pair works too;
* minibatch skips: `all_ok` ANDs the "this minibatch is finite" flag over ranks, so a NaN on one
  rank makes every rank skip that minibatch (a one-sided skip would hang the all-reduce);
* KL controller and score statistics see the global batch (mean KL, gathered scores);
* data: with N ranks, iteration i's N*B queries are consecutive positions of a per-epoch
  permutation of the task's queries shared by all ranks; rank r takes the r-th block of B,
  so ranks see disjoint prompts (like `DistributedSampler`). The sampling generator is
  seeded per rank. With one process nothing changes: a `DistributedTrainer` equals a `Trainer`;
* metrics are all-gathered and averaged (timings: the slowest rank); checkpoints are written
  by rank 0 and hold every rank's RNG states, so a resumed run continues exactly.

MAPPO's centralized critic is DDP-wrapped too (its update calls the critic, so the call goes
through DDP), and its non-finite-loss skips are agreed across ranks like the actors'.

With `sharding="fsdp"` (`--fsdp`, or an accelerate config with `distributed_type: FSDP`) each
agent, the critic and the reference are sharded per decoder block instead (`agents/fsdp.py`);
everything else above is unchanged. DeepSpeed is refused with a clear error (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import sys
import warnings
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import nn

from .checkpoint import atomic_save, load_trainer_state, trainer_state
from .policy import Evaluation
from .train import TrainConfig, Trainer

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


class _Call(nn.Module):
    """Routes a policy method through forward(), so a DDP wrapper around it sees the pass."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, method: str, *args, **kwargs):
        out = getattr(self.policy, method)(*args, **kwargs)
        if isinstance(out, Evaluation):  # a dict: DDP and accelerate's fp32 cast walk dicts
            return {f.name: getattr(out, f.name) for f in fields(out)
                    if getattr(out, f.name) is not None}
        return out


class SyncedPolicy:
    """A policy whose `evaluate` and `__call__` run through a (DDP) wrapper; all else is its own.

    `ppo_update` calls `evaluate` and MAPPO calls the critic, so those passes synchronise the
    gradients; the rollout keeps using the raw policy (`learner.policies`), which needs no sync.
    """

    def __init__(self, policy, wrapped: nn.Module):
        self.policy, self.wrapped = policy, wrapped

    def evaluate(self, input_ids, attention_mask, n_response, **kwargs) -> Evaluation:
        """`policy.evaluate` through the wrapper."""
        return Evaluation(**self.wrapped("evaluate", input_ids, attention_mask, n_response,
                                         **kwargs))

    def __call__(self, *args, **kwargs):
        """`policy.forward` through the wrapper."""
        return self.wrapped("forward", *args, **kwargs)

    def __getattr__(self, name):
        if name in ("policy", "wrapped"):
            raise AttributeError(name)
        return getattr(self.policy, name)


def wrap_policy(policy, accelerator, head_unused: bool = False) -> SyncedPolicy:
    """DDP-wrap one policy so that only its own trainable parameters are synchronised.

    head_unused: the output embedding gets no gradient (a critic trains only its values);
    an untied one is then left out of DDP, which otherwise waits for its gradient forever.
    """
    module = _Call(policy)
    mine = {id(p) for p in policy.trainable_parameters()}
    if head_unused:
        hf = policy.hf_model
        head, emb = hf.get_output_embeddings().weight, hf.get_input_embeddings().weight
        if head is not emb:
            mine.discard(id(head))
    module._ddp_params_and_buffers_to_ignore = [
        name for name, p in module.named_parameters(remove_duplicate=False) if id(p) not in mine
    ] + [name for name, _ in module.named_buffers(remove_duplicate=False)]
    return SyncedPolicy(policy, accelerator.prepare_model(module, device_placement=False))


class _Collectives:
    """The few collectives the learners need; no-ops with one process."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.world_size = accelerator.num_processes

    def _tensor(self, values, dtype=torch.float64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.accelerator.device)

    def all_ok(self, flag: bool) -> bool:
        """True only if flag is True on every rank."""
        if self.world_size == 1:
            return bool(flag)
        t = self._tensor([1.0 if flag else 0.0])
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        return bool(t.item() > 0)

    def mean(self, value: float) -> float:
        """The mean of a float over ranks."""
        if self.world_size == 1:
            return float(value)
        t = self._tensor([float(value)])
        torch.distributed.all_reduce(t)
        return float(t.item()) / self.world_size

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate equal-shaped tensors from all ranks along dim 0."""
        if self.world_size == 1:
            return x
        x = x.detach().contiguous().to(self.accelerator.device)
        out = [torch.empty_like(x) for _ in range(self.world_size)]
        torch.distributed.all_gather(out, x)
        return torch.cat(out)

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.world_size == 1:
            return
        if self.accelerator.device.type == "cpu":  # accelerate would pass device_ids=[rank],
            torch.distributed.barrier()  # which fails for gloo ranks on a host with fewer GPUs
        else:
            self.accelerator.wait_for_everyone()

    def gather_object(self, obj) -> list:
        """Every rank's picklable object, in rank order."""
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out


class SyncedKLController:
    """A KL controller updated with the mean KL over ranks and the global batch size."""

    def __init__(self, controller, comm: _Collectives):
        self.controller, self.comm = controller, comm

    def update(self, current_kl: float, n_steps: int) -> float:
        """The wrapped controller's update on the global batch."""
        return self.controller.update(self.comm.mean(current_kl),
                                      n_steps * self.comm.world_size)

    def __getattr__(self, name):
        if name in ("controller", "comm"):
            raise AttributeError(name)
        return getattr(self.controller, name)


class SyncedMoments:
    """Running score statistics fed with every rank's scores (ranks agree on mean and std)."""

    def __init__(self, moments, comm: _Collectives):
        self.moments, self.comm = moments, comm

    def update(self, x: torch.Tensor):
        """Fold the gathered scores of all ranks into the moments."""
        return self.moments.update(self.comm.gather(x.float()))

    def __getattr__(self, name):
        if name in ("moments", "comm"):
            raise AttributeError(name)
        return getattr(self.moments, name)


def _sync_statistics(agent, comm: _Collectives) -> None:
    """Agree skips across ranks; KL control and score statistics see the global batch."""
    agent.all_ok = comm.all_ok
    if not isinstance(agent.kl_ctl, SyncedKLController):
        agent.kl_ctl = SyncedKLController(agent.kl_ctl, comm)
    if not isinstance(agent.score_stats, SyncedMoments):
        agent.score_stats = SyncedMoments(agent.score_stats, comm)


def _check_single_process_options(learner) -> None:
    """Refuse a token cap on passes (ranks would run different numbers of backward passes) and
    compiled training passes (not tested under DDP/FSDP hooks)."""
    for name, agent in learner.agents.items():
        if agent.cfg.max_tokens_per_pass is not None:
            raise ValueError(f"agent {name!r}: ppo.max_tokens_per_pass="
                             f"{agent.cfg.max_tokens_per_pass} is single-process only; use "
                             "mini_batch_size and grad_accum_steps across processes")
        if getattr(agent.policy, "compile_training", False):
            raise ValueError(f"agent {name!r}: torch_compile=True is single-process only "
                             "(untested with DDP/FSDP); leave it False across processes")


def distribute_learner(learner, accelerator) -> None:
    """Make a built learner multi-process: DDP per agent (and critic) plus synced statistics."""
    _check_single_process_options(learner)
    comm = _Collectives(accelerator)
    for agent in learner.agents.values():
        if not isinstance(agent.policy, SyncedPolicy):
            agent.policy = wrap_policy(agent.policy, accelerator)
        agent.backward = accelerator.backward
        _sync_statistics(agent, comm)
    critic = getattr(learner, "critic", None)
    if critic is not None and not isinstance(critic, SyncedPolicy):
        learner.critic = wrap_policy(critic, accelerator, head_unused=True)
        learner.all_ok = comm.all_ok


def shard_learner(learner, comm: _Collectives) -> None:
    """Make a built learner multi-process with FSDP2: each agent (and critic) sharded per block.

    The optimizers are rebuilt on the sharded parameters; statistics are synced as under DDP.
    """
    from .fsdp import check_shardable, shard
    from .learner import adam

    check_shardable(learner.policies)
    _check_single_process_options(learner)
    for agent in learner.agents.values():
        policy = agent.policy
        agent.policy = SyncedPolicy(policy, shard(_Call(policy), policy))
        agent.optimizer = adam(policy.trainable_parameters(), agent.cfg.lr)
        _sync_statistics(agent, comm)
    critic = getattr(learner, "critic", None)
    if critic is not None:
        learner.critic = SyncedPolicy(critic, shard(_Call(critic), critic))
        learner.critic_optimizer = learner.new_critic_optimizer()
        learner.all_ok = comm.all_ok


def _sharded_roots(learner) -> list[nn.Module]:
    """The FSDP root module of every agent (and of the critic)."""
    roots = [a.policy.wrapped for a in learner.agents.values()]
    roots += list({id(p.ref_model): p.ref_model for p in learner.policies.values()
                   if getattr(p, "ref_model", None) is not None}.values())
    critic = getattr(learner, "critic", None)
    if isinstance(critic, SyncedPolicy):
        roots.append(critic.wrapped)
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
        self.accelerator = accelerator
        self.rank, self.world_size = accelerator.process_index, accelerator.num_processes
        self.comm = _Collectives(accelerator)
        super().__init__(dataclasses.replace(cfg, device=str(accelerator.device)), env_options)
        if self.world_size > 1:
            self.learner.generator.manual_seed(rank_seed(self.cfg.seed, self.rank))
            pool = self.env.task.queries(self.env.config.split)
            self.query_sampler = ShardedQueries(len(pool), self.cfg.batch_size, self.rank,
                                                self.world_size, self.cfg.seed)
        self.sharding = sharding
        if sharding == "fsdp":
            shard_learner(self.learner, self.comm)
        else:
            distribute_learner(self.learner, accelerator)
        self.local_metrics: dict | None = None

    def rollout_context(self):
        """Under FSDP, full parameters on every rank for the whole rollout (no collectives)."""
        if self.sharding != "fsdp":
            return super().rollout_context()
        from .fsdp import gathered

        return gathered(_sharded_roots(self.learner))

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
            from .fsdp import full_state

            state = full_state(trainer_state(self))
        if self.is_main_process:
            state = state or trainer_state(self)
            state.update(world_size=self.world_size, ranks=ranks)
            atomic_save(state, path)
        self.comm.barrier()

    def load(self, path: str) -> None:
        """Resume on every rank; a rank missing from the checkpoint gets derived RNG seeds."""
        state = torch.load(path, map_location="cpu", weights_only=False)
        load_trainer_state(self, state)
        if self.sharding == "fsdp":
            from .fsdp import shard_optimizer_state

            for agent in self.learner.agents.values():
                shard_optimizer_state(agent.optimizer)
            if getattr(self.learner, "critic_optimizer", None) is not None:
                shard_optimizer_state(self.learner.critic_optimizer)
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


# ----------------------------------------------------------------------------- command line

def _option(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def parse_args(argv=None) -> argparse.Namespace:
    """The command line of `python -m agents.distributed`."""
    p = argparse.ArgumentParser(prog="python -m agents.distributed",
                                description="Train one method on one task on every rank of a "
                                            "torchrun / accelerate launch (DDP or FSDP).")
    p.add_argument("--task", default="sentiment")
    p.add_argument("--method", default="cory")
    p.add_argument("--model", help="HF name or local folder (default: the task's offline LM)")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="episodes per rank per iteration")
    p.add_argument("--mini-batch-size", type=int, default=8)
    p.add_argument("--grad-accum-steps", type=int, default=1)
    p.add_argument("--ppo-epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=1.41e-5)
    p.add_argument("--init-kl-coef", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--t-rex", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    p.add_argument("--load-in-4bit", action="store_true")
    p.add_argument("--task-option", action="append", default=[], type=_option,
                   metavar="KEY=JSON", help="a task keyword argument (repeatable)")
    p.add_argument("--cpu", action="store_true", help="train on CPU even if a GPU is visible")
    p.add_argument("--mixed-precision", choices=["no", "bf16"], default=None)
    p.add_argument("--fsdp", action="store_true",
                   help="shard each agent with FSDP2 (default: DDP, or what the accelerate "
                        "config says)")
    p.add_argument("--out", help="folder for metrics.jsonl and checkpoint.pt (rank 0 writes)")
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N iterations")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig the command line describes."""
    from .policy import LoraSettings
    from .ppo import PPOConfig

    ppo = PPOConfig(batch_size=args.batch_size, mini_batch_size=args.mini_batch_size,
                    grad_accum_steps=args.grad_accum_steps, ppo_epochs=args.ppo_epochs,
                    lr=args.lr, init_kl_coef=args.init_kl_coef)
    return TrainConfig(task=args.task, method=args.method, model=args.model,
                       iterations=args.iterations, batch_size=args.batch_size,
                       max_new_tokens=args.max_new_tokens, seed=args.seed, t_rex=args.t_rex,
                       lora=LoraSettings(r=args.lora_r, alpha=2 * args.lora_r)
                       if args.lora_r else None, load_in_4bit=args.load_in_4bit,
                       task_options=dict(args.task_option), ppo=ppo)


def _drop_lines_from(path: str, iteration: int) -> None:
    """Keep only the metrics lines of iterations before `iteration` (atomically)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = [line for line in f if line.strip()]

    def before(line: str) -> bool:
        try:
            return json.loads(line).get("iteration", iteration) < iteration
        except json.JSONDecodeError:  # a line cut short by a crash
            return False

    keep = [line for line in lines if before(line)]
    if len(keep) != len(lines):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(keep)
        os.replace(tmp, path)


def main(argv=None) -> int:
    """Entry point: build, optionally resume, train, log (rank 0) and checkpoint."""
    args = parse_args(argv)
    cfg = config_from_args(args).validate()  # a bad config fails before any model loads
    accelerator = make_accelerator(cpu=True if args.cpu else None,
                                   mixed_precision=args.mixed_precision)
    trainer = DistributedTrainer(cfg, accelerator, sharding="fsdp" if args.fsdp else None)
    ckpt = os.path.join(args.out, "checkpoint.pt") if args.out else None
    if args.resume and ckpt and os.path.exists(ckpt):
        trainer.load(ckpt)
    log = None
    if args.out and trainer.is_main_process:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "metrics.jsonl")
        _drop_lines_from(path, trainer.iteration)  # those after the checkpoint are redone
        log = open(path, "a")
    try:
        for metrics in trainer.run():
            if trainer.is_main_process:
                line = json.dumps(metrics, default=str)
                if log:
                    log.write(line + "\n")
                    log.flush()
                    os.fsync(log.fileno())
                a = metrics["llm_0"]
                print(f"iter {metrics['iteration']}: task_reward {a['task_reward']:.3f} "
                      f"kl {a['kl']:.3f} ({trainer.world_size} ranks)", flush=True)
            if ckpt and args.save_every and trainer.iteration % args.save_every == 0:
                trainer.save(ckpt)
        if ckpt:
            trainer.save(ckpt)
    finally:
        if log:
            log.close()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
