"""The OpenEnv server as a service, loaded over loopback: every good episode right, bad clients
answered by name, bounded and idle connections, flat memory, one log line per connection, a
clean stop."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv.core")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "perf"))
import openenv_load  # noqa: E402  (tools/perf/openenv_load.py, a script, not a package)


def test_many_clients_bad_clients_and_a_sigterm(tmp_path):
    out = openenv_load.run(clients=12, episodes=4, rounds=3, idle_s=2.0,
                           log=tmp_path / "server.log")
    rows, checks = out["rounds"], out["checks"]
    # every good episode completed with the text env's rewards (run() raises otherwise)
    assert [r["episodes"] for r in rows] == [12 * 4 + 1] * 3
    assert rows[-1]["server_rss_mb"] - rows[1]["server_rss_mb"] < 16  # flat after warm-up
    assert "server full: 16 of 16 connections in use" in checks["bound"]["refusal"]
    assert checks["idle"] == {"code": 1001, "reason": "idle for 2 s"}
    assert checks["sigterm"] == {"client_close_code": 1012, "exit_code": 0}
    log = checks["log"]
    assert log["tracebacks"] == 0
    assert log["connection_lines"] == log["connections_opened"] == 3 * 15 + 18 + 2
    assert "stopped on SIGTERM" in log["last_line"] and "1 refused" in log["last_line"]
    text = (tmp_path / "server.log").read_text()
    for ending in ("client closed", "client vanished", "idle for 2 s", "server stopping",
                   "refused (server full"):
        assert ending in text, ending
