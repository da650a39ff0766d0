"""Multi-process training: every learner (CORY included) under DDP or FSDP2, a data shard per rank.

    torchrun --nproc_per_node 2 -m agents.distributed --task sentiment --method cory --cpu
    torchrun --nproc_per_node 2 -m agents.distributed --task sentiment --method cory --cpu --fsdp
    accelerate launch --multi_gpu --num_processes 4 -m agents.distributed --task imdb ...

or from Python, inside a script started by torchrun / accelerate launch:

    trainer = DistributedTrainer(TrainConfig(task="sentiment", method="cory"))
    for metrics in trainer.run():          # metrics are averaged over ranks
        if trainer.is_main_process:
            print(metrics["llm_0"]["task_reward"])

Files: `ranks.py` (the collectives and model wrappers a learner calls through its `comm`),
`fsdp.py` (FSDP2 sharding), `trainer.py` (`DistributedTrainer`: data shards, metrics,
checkpoints), `__main__.py` (the command line). docs/scaling.md says what is synchronised.
"""

from .ranks import DDPComm, FSDPComm, SyncedPolicy, wrap_policy
from .trainer import (
    SUPPORTED,
    DistributedTrainer,
    ShardedQueries,
    make_accelerator,
    rank_seed,
    reduce_metrics,
)

__all__ = ["DDPComm", "DistributedTrainer", "FSDPComm", "SUPPORTED", "ShardedQueries",
           "SyncedPolicy", "make_accelerator", "rank_seed", "reduce_metrics", "wrap_policy"]
