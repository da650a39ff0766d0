"""A study over every core and any Ray cluster: one writer, the same records, resume after a
lost worker, and bad settings refused by name before anything is written."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from benchmarks.evidence.records import FORMAT, RunData
from benchmarks.settings.config import resolve_config
from benchmarks.study.coordinator import StudyFailed, run_benchmark
from benchmarks.study.executors import Execution

FAIL_PLUGIN = '''
from agents.learners.registry import register_learner
from agents.learners.ppo_learner import PPO


@register_learner("fails-on-seed-1")
class FailsOnSeed1(PPO):
    def update(self, turns, iteration):
        if self.seed == 1 and iteration == 1:
            raise RuntimeError("seed 1 breaks at iteration 1")
        return super().update(turns, iteration)
'''


def quick(**kw):
    """A two-run --quick study of the tiny offline model."""
    return resolve_config("offline", quick=True, **{"methods": ["ppo"], "seeds": [0, 1], **kw})


def records(folder: Path) -> tuple[list, list]:
    """A folder's records without their wall-clock fields."""
    data = RunData.load(folder)
    strip = [{k: v for k, v in r.items() if not k.startswith("time_")} for r in data.rows]
    return strip, data.evals


def test_workers_2_equal_workers_1_record_for_record(tmp_path):
    cfg = quick(methods=["ppo", "cory"])
    run_benchmark(cfg, tmp_path / "one", progress=False)
    run_benchmark(cfg, tmp_path / "two", progress=False, execution=Execution(workers=2))
    assert records(tmp_path / "one") == records(tmp_path / "two")
    log = (tmp_path / "two" / "log.txt").read_text()
    assert "2 at once, 1 thread(s) each" in log and "running on process" in log
    ckpts = sorted(p.name for p in (tmp_path / "two" / "ckpt").iterdir())
    assert ckpts == sorted(p.name for p in (tmp_path / "one" / "ckpt").iterdir())


def test_a_failed_run_is_named_with_its_traceback_and_the_others_finish(tmp_path, capsys):
    plugin = tmp_path / "failing.py"
    plugin.write_text(FAIL_PLUGIN)
    cfg = quick(methods=["fails-on-seed-1"], **{"import": [str(plugin)]})
    with pytest.raises(StudyFailed, match=r"1 run\(s\) failed: sentiment-fails-on-seed-1-seed1"):
        run_benchmark(cfg, tmp_path / "run", progress=False, execution=Execution(workers=2))
    assert "seed 1 breaks at iteration 1" in capsys.readouterr().err
    done = sorted(p.name for p in (tmp_path / "run" / "done").iterdir())
    assert done == ["sentiment-fails-on-seed-1-seed0"]
    assert (tmp_path / "run" / "report.md").exists()
    assert "RuntimeError: seed 1 breaks" in (tmp_path / "run" / "log.txt").read_text()


@pytest.mark.parametrize("execution, message", [
    (Execution(workers=0), "workers must be a positive integer, got 0"),
    (Execution(ray="127.0.0.1:1"), "--ray 127.0.0.1:1: no Ray cluster answers there"),
    (Execution(ray="nowhere"), "--ray must be auto, local or HOST:PORT"),
    (Execution(storage="/tmp"), "--storage is for --ray"),
    (Execution(ray="auto", storage="/no/such/folder"), "--storage '/no/such/folder' is not a"),
])
def test_bad_execution_settings_are_refused_by_name_before_anything_is_written(
        tmp_path, execution, message):
    with pytest.raises(ValueError, match=message):
        run_benchmark(quick(), tmp_path / "run", progress=False, execution=execution)
    assert not (tmp_path / "run").exists()


def test_more_threads_than_cores_is_a_warning_naming_both(tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with pytest.warns(RuntimeWarning, match=r"--workers 3 x --threads 1 = 3 threads on 2 cores"):
        Execution(workers=3).check(threads=1)


def test_the_command_line_takes_the_execution_settings(tmp_path, capsys):
    from benchmarks.run import main

    for argv, message in ((["--workers", "0"], "workers must be a positive integer, got 0"),
                          (["--ray", "127.0.0.1:1"], "no Ray cluster answers there")):
        with pytest.raises(SystemExit):
            main([*argv, "--quick", "--out", str(tmp_path / "run")])
        assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def cluster():
    """A real two-node Ray cluster on this machine (loopback), one CPU each."""
    import os

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # nothing leaves the machine
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # the nodes listen on loopback only
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    second = c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c, second
    ray.shutdown()
    c.shutdown()


def _nodes(folder: Path) -> set[str]:
    """The node ids the log says runs ran on."""
    return {line.rsplit("running on node ", 1)[1].strip()
            for line in (folder / "log.txt").read_text().splitlines() if "running on node" in line}


@pytest.mark.slow
def test_a_study_on_a_two_node_ray_cluster_resumes_after_a_lost_node(tmp_path, cluster):
    c, second = cluster
    address = c.address
    # both nodes run runs; records equal this process's
    cfg = quick()
    run_benchmark(cfg, tmp_path / "here", progress=False)
    run_benchmark(cfg, tmp_path / "ray", progress=False, execution=Execution(ray=address))
    assert records(tmp_path / "ray") == records(tmp_path / "here")
    assert len(_nodes(tmp_path / "ray")) == 2
    import ray

    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}  # loopback only
    # a node lost mid-run: the study names the run and ends; --resume completes it
    long = quick(iterations=20)  # long enough that the node is lost mid-run
    run_benchmark(long, tmp_path / "whole", progress=False)
    folder = tmp_path / "lost"

    def kill_second_node():
        deadline = time.time() + 120
        while time.time() < deadline:
            lines = (folder / "metrics.jsonl").read_text().splitlines() \
                if (folder / "metrics.jsonl").exists() else []
            if len(lines) >= 4:
                c.remove_node(second, allow_graceful=False)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_second_node)
    killer.start()
    with pytest.raises(StudyFailed, match=r"run\(s\) failed: "):
        run_benchmark(long, folder, progress=False, execution=Execution(ray=address))
    killer.join()
    assert "its worker was lost" in (folder / "log.txt").read_text()
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    run_benchmark(long, folder, resume=True, progress=False, execution=Execution(ray=address))
    assert records(folder) == records(tmp_path / "whole")
    assert json.loads((folder / "run_config.json").read_text())["format"] == FORMAT


@pytest.mark.slow
def test_resume_after_the_coordinator_is_killed_runs_only_what_is_missing(tmp_path):
    """SIGKILL the coordinating process of a --workers 2 study mid-run: its workers stop with
    it, and --resume finishes with records equal to an uninterrupted study."""
    import os
    import signal
    import subprocess
    import sys

    args = ["--quick", "--methods", "ppo,cory", "--seeds", "0,1", "--iterations", "6",
            "--no-progress"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    subprocess.run([sys.executable, "-m", "benchmarks.run", *args, "--out", str(whole)],
                   check=True, capture_output=True)
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.run", *args, "--workers", "2",
                             "--out", str(cut)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not (
            (cut / "metrics.jsonl").exists()
            and len((cut / "metrics.jsonl").read_text().splitlines()) >= 6):
        time.sleep(0.05)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                              text=True).stdout.split()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 30  # the workers notice their coordinator is gone
    while time.time() < deadline and any(os.path.exists(f"/proc/{c}") and
                                         "Z" not in open(f"/proc/{c}/stat").read().split()[2]
                                         for c in children):
        time.sleep(0.2)
    assert not list((cut / "done").glob("*")) or len(list((cut / "done").glob("*"))) < 4
    subprocess.run([sys.executable, "-m", "benchmarks.run", "--resume", "--out", str(cut),
                    "--workers", "2", "--no-progress"], check=True, capture_output=True)
    assert records(cut) == records(whole)
    assert "resuming 4 runs" in (cut / "log.txt").read_text()


def _docs_cluster_recipe() -> list[str]:
    """The loopback-cluster recipe of docs/scaling.md, as written."""
    import re

    text = (Path(__file__).resolve().parents[2] / "docs/scaling.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S)
                 if "benchmarks.cluster" in b)
    return [line.split("  #")[0].strip() for line in block.strip().splitlines()]


@pytest.mark.slow
def test_the_docs_loopback_cluster_recipe_runs_as_written(tmp_path):
    """docs/scaling.md's three lines: the cluster prints its loopback address, a study runs on
    it, and SIGTERM (what `kill %1` sends) stops every node."""
    import os
    import shlex
    import signal
    import subprocess
    import sys

    start, study, stop = _docs_cluster_recipe()
    assert start.endswith("&") and stop == "kill %1"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # the recipe needs no variable set
    root = Path(__file__).resolve().parents[2]
    words = shlex.split(start[:-1])
    cluster = subprocess.Popen([sys.executable, *words[1:]], cwd=root, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        line = cluster.stdout.readline()
        assert "on loopback: --ray 127.0.0.1:" in line, line
        address = line.rsplit(" ", 1)[1].strip()
        words = shlex.split(study.replace("127.0.0.1:PORT", address).replace(
            "runs/on-ray", str(tmp_path / "on-ray")))
        done = subprocess.run([sys.executable, *words[1:], "--no-progress"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "running on node" in (tmp_path / "on-ray" / "log.txt").read_text()
    finally:
        cluster.send_signal(signal.SIGTERM)
        assert cluster.wait(timeout=90) is not None


def test_ray_to_an_address_no_cluster_answers_at_stops_in_bounded_time_and_writes_nothing(
        tmp_path):
    """Something listens on the port but no Ray cluster answers: refused within the connect
    timeout naming the address and the cause; SIGTERM stops the wait at once; no folder."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    address = f"127.0.0.1:{server.getsockname()[1]}"
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--ray", address, "--out",
           str(tmp_path / "study"), "--no-progress"]
    try:
        t0 = time.time()
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=180,
                              env={**os.environ, "CORY_RAY_CONNECT_TIMEOUT": "5"})
        assert done.returncode == 2 and time.time() - t0 < 120, done.stderr[-1500:]
        assert f"--ray {address}: something listens there, but no Ray cluster answered " \
               f"within 5 s" in done.stderr, done.stderr[-1500:]
        assert not (tmp_path / "study").exists()
        for stop in (signal.SIGTERM, signal.SIGINT):  # `kill`, and Ctrl-C
            proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True,
                                    env={**os.environ, "CORY_RAY_CONNECT_TIMEOUT": "300"})
            time.sleep(8)  # past the imports, into the connection attempt
            proc.send_signal(stop)
            t1 = time.time()
            proc.wait(timeout=30)
            assert time.time() - t1 < 15 and not (tmp_path / "study").exists(), stop
    finally:
        server.close()


def test_sigterm_stops_a_study_on_local_workers_at_once_and_leaves_none_training(tmp_path):
    """Stopping a `--workers 2` study ends it in seconds (its runs abandoned at their last
    checkpoint), not when the runs would have finished, and no worker trains on."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "study"
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.run", "--quick", "--methods",
                             "ppo,cory", "--iterations", "300", "--workers", "2", "--threads",
                             "1", "--no-progress", "--out", str(out)],
                            cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    log = out / "log.txt"
    while time.time() < deadline and not (log.exists() and "it 1:" in log.read_text()):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    t0 = time.time()
    _, err = proc.communicate(timeout=60)
    assert time.time() - t0 < 20 and proc.returncode == 130, err[-2000:]
    assert "--resume --out" in err
    left = subprocess.run(["pgrep", "-s", str(proc.pid), "-f", "spawn_main"],
                          capture_output=True, text=True)
    assert not left.stdout.strip(), left.stdout  # no worker of its session trains on
