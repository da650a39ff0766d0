"""Hold a Ray cluster of several nodes on this machine's loopback, for a study or a test.

    python -m benchmarks.cluster --nodes 2 --cpus 1      # prints the address; Ctrl-C stops it
    python -m benchmarks.run --quick --ray 127.0.0.1:PORT    # in another shell, while it runs

Every node listens on 127.0.0.1 only (`benchmarks.study.ray_cluster` says why Ray's own `ray
start` cannot do that for a second node). The command prints one line, `ray cluster of N
nodes x C CPUs on loopback: --ray 127.0.0.1:PORT`, once every node is up, and stops every
node on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import importlib.util

from benchmarks.study.ray_cluster import hold_cluster
from cory_common import cli
from cory_common.checks import check_int


def main(argv: list[str] | None = None) -> None:
    """Start the cluster, print its address, hold it until interrupted."""
    p = cli.Parser("python -m benchmarks.cluster", description=__doc__)
    p.add_argument("--nodes", type=int, default=2, help="nodes, the head included (default 2)")
    p.add_argument("--cpus", type=int, default=1, help="CPUs of each node (default 1)")
    args = p.parse_args(argv)
    try:
        check_int("--nodes", args.nodes, 1)
        check_int("--cpus", args.cpus, 1)
    except ValueError as err:
        p.error(str(err))
    if importlib.util.find_spec("ray") is None:
        p.error("Ray is not installed: pip install 'cory[ray]' (make install installs it)")
    hold_cluster(args.nodes, args.cpus, ready=lambda address: print(
        f"ray cluster of {args.nodes} nodes x {args.cpus} CPUs on loopback: --ray {address}",
        flush=True))


if __name__ == "__main__":
    main()
