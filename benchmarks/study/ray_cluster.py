"""Ray clusters for a study: checking an address before anything is written, connecting to it in
bounded time, and holding a cluster of several nodes on this machine's loopback.

A cluster on one machine listens on loopback only when every Ray process of it, the driver
included, runs with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: Ray otherwise replaces 127.0.0.1 with
the machine's interface address, and a driver told 127.0.0.1:PORT keeps trying the interface
address ("Failed to connect to GCS at address ..."). With the variable set, Ray's own `ray
start --address` refuses to add a node ("Multi-node Ray clusters are not supported on Windows
and OSX"), so `python -m benchmarks.cluster` holds such a cluster through Ray's Python API,
and `--ray` to a loopback address sets the variable for its own driver.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import socket
import subprocess
import sys
import time

LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
CONNECT_TIMEOUT = float(os.environ.get("CORY_RAY_CONNECT_TIMEOUT", "60"))  # seconds


def is_loopback(host: str) -> bool:
    """Whether a host names this machine's loopback (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def ray_environment(address: str) -> None:
    """The variables a driver for `address` needs: no usage report, and loopback only for a
    cluster on this machine's loopback (or `local`)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no report sent off the machine
    host = address.rpartition(":")[0]
    if address == "local" or is_loopback(host):
        os.environ.setdefault(LOOPBACK_ONLY, "0")


def check_ray(address: str, timeout: float | None = None) -> None:
    """Ray is installed and, for HOST:PORT, a Ray cluster answers there within `timeout`
    seconds (a child process tries; a ValueError names the address and the likely cause)."""
    if importlib.util.find_spec("ray") is None:
        raise ValueError(f"--ray {address} needs Ray: pip install 'cory[ray]' (make install "
                         f"installs it)")
    if address in ("auto", "local"):
        return
    host, sep, port = address.rpartition(":")
    if address.startswith("ray://") or not sep or not port.isdigit():
        raise ValueError(f"--ray must be auto, local or HOST:PORT (the cluster's GCS address), "
                         f"got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as err:
        raise ValueError(f"--ray {address}: no Ray cluster answers there ({err}); start one "
                         f"with `ray start --head` (or, on this machine's loopback, `python -m "
                         f"benchmarks.cluster`), or give its address") from None
    probe(address, CONNECT_TIMEOUT if timeout is None else timeout)


PROBE = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False, "
         "include_dashboard=False, configure_logging=False); "
         "print(int(ray.cluster_resources().get('CPU', 0)))")


def probe(address: str, timeout: float) -> int:
    """Connect to `address` from a child process, killed after `timeout` seconds (or when
    this process is interrupted); the cluster's CPUs, or a ValueError saying why not."""
    env = dict(os.environ)
    if is_loopback(address.rpartition(":")[0]):
        env.setdefault(LOOPBACK_ONLY, "0")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    child = subprocess.Popen([sys.executable, "-c", PROBE, address], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        said = _last_line(err)
        raise ValueError(
            f"--ray {address}: something listens there, but no Ray cluster answered within "
            f"{timeout:g} s" + (f" (Ray said: {said})" if said else "") + "; "
            + ("a cluster on this machine's loopback needs every node started with "
               f"{LOOPBACK_ONLY}=0 (python -m benchmarks.cluster does it)"
               if is_loopback(address.rpartition(":")[0]) else
               "is it the head's GCS port, and can this machine reach every node?")) from None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != 0:
        raise ValueError(f"--ray {address}: Ray could not connect ({_last_line(err)})")
    return int(out.strip().splitlines()[-1]) if out.strip() else 0


def _last_line(text: str) -> str:
    """The last non-empty line of a child's stderr, shortened."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def hold_cluster(nodes: int, cpus: int, ready=print) -> None:
    """Start a Ray cluster of `nodes` nodes of `cpus` CPUs on loopback, call `ready(address)`,
    and hold it until interrupted (Ctrl-C or SIGTERM); then stop every node."""
    import signal

    os.environ[LOOPBACK_ONLY] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray.cluster_utils import Cluster

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": cpus, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=cpus)
        cluster.wait_for_nodes()
        ready(cluster.address)
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.shutdown()
