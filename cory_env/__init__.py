"""cory_env: CORY's sequential multi-LLM token-level environment (PettingZoo AEC + batched)."""

from .aec import env, parallel_env, raw_env
from .batched import BatchedCoryEnv
from .chain import AGENTS, acting_order, agent_names, copy_rate
from .config import EnvConfig
from .tasks import (
    Query,
    Task,
    is_exact_match,
    make_task,
    offline_model,
    register_task,
    registered_tasks,
    task_defaults,
)
from .text import Prompt, text_env, text_parallel_env

__all__ = [
    "AGENTS", "BatchedCoryEnv", "agent_names", "EnvConfig", "Query", "Task", "env",
    "is_exact_match", "make_task", "offline_model", "parallel_env", "raw_env", "register_task",
    "registered_tasks", "acting_order", "task_defaults", "Prompt", "copy_rate", "text_env",
    "text_parallel_env",
]
