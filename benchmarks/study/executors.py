"""Where a study's runs execute: in this process, in N worker processes of this machine, or as
tasks on a Ray cluster. Each executor runs `benchmarks.study.worker.train_run` and hands its
messages to the coordinator in the order each run sent them; the coordinator alone writes the
folder.

    executor = make_executor(Execution(workers=2), threads=1)  # or ray="auto", storage=...
    executor.submit(job, on_message); events = executor.wait(1.0)  # [("message", msg) | ...]

Every run ends with an ("end", key, error) message: error is None, or the worker's traceback
as text. A run whose worker dies without one (a lost node, a killed process) comes back as
("lost", key, why).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import tempfile
import threading
import time
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

from benchmarks.study.ray_cluster import check_ray, ray_environment
from benchmarks.study.worker import Job, train_run
from cory_common.checks import check_int, meta
from cory_common.threads import configure


@dataclass
class Execution:
    """Where a study runs; none of it changes a record, so a resume may change any of it."""

    workers: int = field(default=1, metadata=meta(
        "runs at once on this machine, each with --threads torch threads (1: one after another "
        "in this process)"))
    ray: str | None = field(default=None, metadata=meta(
        "run on a Ray cluster: auto (the one this machine belongs to), HOST:PORT, or local "
        "(a one-machine cluster started here); needs pip install 'cory[ray]'"))
    storage: str | None = field(default=None, metadata=meta(
        "with --ray: a folder every node reaches, for checkpoints (none: they travel through "
        "Ray's object store to this machine)"))

    def check(self, threads: int, wandb: str | None = None) -> Execution:
        """Refuse bad settings by name before anything runs or is written; warn when the
        workers ask for more threads than the machine has cores. Checked once per setting: the
        command line checks before anything loads, and run_benchmark does not check again."""
        if self.__dict__.get("_checked") == (threads, wandb):
            return self
        check_int("workers", self.workers, 1)
        if self.storage is not None and self.ray is None:
            raise ValueError("--storage is for --ray: on one machine the study folder is shared")
        if (self.ray is not None or self.workers > 1) and wandb:
            raise ValueError("--wandb logs one run at a time: use it with --workers 1")
        if self.ray is not None:
            check_ray(self.ray)
        if self.storage is not None:
            check_storage(self.storage)
        cores = os.cpu_count() or 1
        if self.ray is None and self.workers * max(threads, 1) > cores:
            warnings.warn(f"--workers {self.workers} x --threads {max(threads, 1)} = "
                          f"{self.workers * max(threads, 1)} threads on {cores} cores: runs will "
                          f"wait for each other's cores", RuntimeWarning, stacklevel=2)
        self.__dict__["_checked"] = (threads, wandb)
        return self


def check_storage(path: str) -> None:
    """A folder this process can write (so can the nodes, the user says)."""
    if not os.path.isdir(path):
        raise ValueError(f"--storage {path!r} is not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".cory-check-"):
            pass
    except OSError as err:
        raise ValueError(f"--storage {path!r} is not writable: {err}") from None


def run_and_end(job: Job, emit, where: str = "") -> None:
    """train_run, then ("end", key, None or the traceback as text), whatever happened."""
    error = None
    try:
        if where:
            emit(("log", job.spec.key, f"running on {where}"))
        train_run(job, emit)
    except Exception:  # noqa: BLE001  (every failure is the run's own, said by name)
        error = traceback.format_exc()
    emit(("end", job.spec.key, error))


class InProcess:
    """`--workers 1`: each run in this process, one after another (no new dependency)."""

    capacity = 1
    ckpt_dir: str | None = None  # set by the coordinator: the study folder's ckpt/

    def __init__(self, threads: int = 0):
        self.threads = threads

    def submit(self, job: Job, on_message) -> None:
        """Run the job now at the study's threads, its messages straight to on_message (the
        caller's thread count is given back after)."""
        import torch

        before = torch.get_num_threads()
        try:
            if self.threads:
                torch.set_num_threads(self.threads)
            run_and_end(job, on_message)
        finally:
            torch.set_num_threads(before)

    def wait(self, timeout: float) -> list[tuple]:
        """Nothing is left waiting: every run ran in submit."""
        return []

    def close(self) -> None:
        """Nothing to release."""


_QUEUE = None  # a pool worker's message queue (set by _init_worker)


def _init_worker(messages, threads: int) -> None:
    """A pool worker: its message queue, its torch threads, and a watch that ends it when the
    coordinator dies (a killed study leaves no worker training on)."""
    global _QUEUE
    _QUEUE = messages
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
    configure(threads)


def _pool_task(job: Job) -> None:
    """A run in a pool worker, its messages on the shared queue."""
    run_and_end(job, _QUEUE.put, f"process {os.getpid()}")


class LocalPool:
    """`--workers N`: up to N runs at once in worker processes of this machine (spawned, so
    each starts clean), their messages on one queue."""

    def __init__(self, workers: int, threads: int):
        ctx = multiprocessing.get_context("spawn")
        self.capacity, self.messages = workers, ctx.Queue()
        self.pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                        initargs=(self.messages, threads))
        self.futures: dict[str, object] = {}
        self.ckpt_dir: str | None = None

    def submit(self, job: Job, on_message) -> None:
        """Start the job on a free worker."""
        self.futures[job.spec.key] = self.pool.submit(_pool_task, job)

    def wait(self, timeout: float) -> list[tuple]:
        """The messages that arrived within timeout, then any run whose worker died."""
        events = []
        try:
            events.append(("message", self.messages.get(timeout=timeout)))
            while True:
                events.append(("message", self.messages.get_nowait()))
        except queue.Empty:
            pass
        for key, future in list(self.futures.items()):
            if future.done():
                del self.futures[key]
                err = future.exception()
                if isinstance(err, BrokenProcessPool):
                    events.append(("lost", key, f"its worker process died: {err}"))
                elif err is not None:  # the job never ran (it could not be sent, say)
                    events.append(("lost", key, f"{type(err).__name__}: {err}"))
        return events

    def close(self) -> None:
        """Stop the workers now (a run still going is abandoned: its checkpoint resumes it);
        without the terminate, the interpreter's exit would wait for the runs to finish."""
        workers = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join(timeout=10)


class RayExecutor:
    """`--ray ADDRESS`: each run a Ray task asking for `threads` CPUs (and a GPU with
    `--device cuda`), its messages through a Ray queue; checkpoints through `storage` (a path
    every node reaches) or, without one, as bytes through Ray's object store."""

    def __init__(self, address: str, threads: int, gpus: float = 0.0,
                 storage: str | None = None):
        ray_environment(address)
        import ray
        from ray.util.queue import Queue

        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=None if address == "local" else address,
                     log_to_driver=False, include_dashboard=False, configure_logging=False)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        # the queue lives on this node: a lost worker node must not take the messages with it
        self.messages = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
        self.task = ray.remote(_ray_task).options(num_cpus=max(threads, 1), num_gpus=gpus,
                                                  max_retries=0)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.capacity = max(1, cpus // max(threads, 1))
        self.refs: dict[str, object] = {}
        self.ckpt_dir = storage

    def submit(self, job: Job, on_message) -> None:
        """Send the job to the cluster (its checkpoint bytes through the object store)."""
        self.refs[job.spec.key] = self.task.remote(job, self.messages)

    def wait(self, timeout: float) -> list[tuple]:
        """The messages that arrived within timeout, then any run whose task was lost."""
        events = []
        try:
            events.append(("message", self.messages.get(timeout=timeout)))
            events += [("message", m) for m in self.messages.get_nowait_batch(
                self.messages.qsize())]
        except queue.Empty:
            pass
        except Exception as err:  # noqa: BLE001  ray's Empty is its own class
            if type(err).__name__ != "Empty":
                raise
        ready, _ = self.ray.wait(list(self.refs.values()), num_returns=len(self.refs),
                                 timeout=0) if self.refs else ([], [])
        for key, ref in list(self.refs.items()):
            if ref in ready:
                del self.refs[key]
                try:
                    self.ray.get(ref)
                except Exception as err:  # noqa: BLE001  a lost node or a killed worker
                    events.append(("lost", key, f"{type(err).__name__}: {err}"))
        return events

    def close(self) -> None:
        """Cancel what still runs; leave the cluster up (it is the user's)."""
        for ref in self.refs.values():
            self.ray.cancel(ref, force=True)


def _ray_task(job: Job, messages) -> None:
    """A run as a Ray task, its messages on the Ray queue."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    configure(job.cfg.threads)
    run_and_end(job, messages.put, f"node {node}")


def make_executor(execution: Execution, threads: int = 1, gpus: float = 0.0):
    """The executor of a study's settings: Ray when `ray` names a cluster, else a local pool of
    `workers` processes, else this process."""
    if execution.ray is not None:
        try:
            return RayExecutor(execution.ray, threads, gpus, execution.storage)
        except ConnectionError as err:
            raise ValueError(f"--ray {execution.ray}: {err}") from None
    if execution.workers > 1:
        return LocalPool(execution.workers, threads)
    return InProcess(threads)
