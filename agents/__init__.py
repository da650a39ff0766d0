"""agents: LLM policies as MARL agents, token-level PPO, and the swappable learners.

One room per job (imports flow downward: distributed, interop → training → learners → llm →
cory_env; `tests/test_architecture.py` checks it):

- `agents.llm`: an LLM as a policy (the model, sampling, KV cache, speed settings, loading,
  and the one decode loop).
- `agents.learners`: how policies learn (learners and their registry, structures with CORY's
  among them, the PPO maths, the KL and reward shaping).
- `agents.training`: running training (the config, the trainer, checkpoints and restoring a
  saved run).
- `agents.distributed`: the same training over processes (DDP, FSDP2).
- `agents.refmodels`: the offline reference models (built below training; whether a model has
  CORY's mechanism is measured by the benchmark, `benchmarks.mechanism.measure`).
- `agents.interop`: other libraries' interfaces (Tianshou).
- `agents.play`: watch a model play the env (`python -m agents.play`).
"""
