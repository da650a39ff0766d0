"""Tasks: the Task interface, the registry and the built-in tasks."""

from . import hf, offline, reasoning, reviews, textarena  # noqa: F401  (the built-in tasks)
from .base import (
           Query,
           Task,
           is_exact_match,
           make_task,
           offline_model,
           register_task,
           registered_tasks,
           task_options,
)
from .course import CourseTask  # noqa: F401  (registers course)

__all__ = ["Query", "Task", "is_exact_match", "make_task", "offline_model", "register_task",
           "registered_tasks", "task_options"]
