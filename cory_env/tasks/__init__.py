"""Tasks: the Task interface, the registry and the built-in tasks (every module of this
package registers the tasks it defines; `register_builtin` imports them all)."""

from .base import (
           Query,
           Task,
           is_exact_match,
           make_task,
           offline_model,
           register_builtin,
           register_task,
           registered_tasks,
           task_defaults,
)

register_builtin()

__all__ = ["Query", "Task", "is_exact_match", "make_task", "offline_model", "register_task",
           "registered_tasks", "task_defaults"]
