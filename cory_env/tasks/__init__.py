"""Tasks: the Task interface, the registry and the built-in tasks."""

from . import hf, offline  # noqa: F401  (registers imdb, gsm8k, sentiment, arithmetic)
from .base import Query, Task, make_task, register_task, registered_tasks, task_options
from .course import CourseTask  # noqa: F401  (registers course)

__all__ = ["Query", "Task", "make_task", "register_task", "registered_tasks", "task_options"]
