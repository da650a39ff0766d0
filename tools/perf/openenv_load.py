"""The OpenEnv server under load and bad clients, over loopback: throughput, memory, endings.

    python tools/perf/openenv_load.py --clients 32 --episodes 10 --rounds 5

Starts `python -m cory_env.openenv` in a child process (task `course`; the client plays the
observer, the server hosts `pioneer` below), then:
- rounds: `clients` OpenEnv clients at once, each playing `episodes` episodes, every reward and
  task reward checked against the text env played here with the same seed; beside them, bad
  clients (frames that are not JSON, binary, of an unknown type, a step before reset, a wrong
  action field, each answered by name, then a good episode on the same connection; a client that
  vanishes mid-episode; one that connects and leaves). After each round: the server's
  resident memory.
- the bound: `max_connections` held connections, then one more is refused with "server full", and
  a connection opens again once they close;
- idle: a connection that sends nothing for longer than the idle timeout is closed with 1001;
- SIGTERM with a connection mid-episode: that client sees 1012, the server exits 0.
Prints one row per round (connections, episodes, episodes/s, memory) and the checks as JSON; the
server's log must hold one line per connection and no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pioneer(prompt: str) -> str:
    """The hosted pioneer: the right colour for a thing with an even-length name, else 'red'."""
    from cory_env.tasks.course import THINGS

    thing = prompt.split()[2]
    return THINGS[thing] if len(thing) % 2 == 0 else "red"


def observer(seed: int):
    """The client's observer for a seed: it copies the hint on even seeds, else answers right."""
    from cory_env.tasks.course import THINGS

    if seed % 2 == 0:
        return lambda prompt: prompt.split("hint :", 1)[1].strip()
    return lambda prompt: THINGS[prompt.split()[2]]


def expected(seed: int) -> dict[str, float]:
    """Each role's task reward when the text env is played here with this seed."""
    from cory_env.demo import evaluate

    played = evaluate({"pioneer": pioneer, "observer": observer(seed)}, episodes=1, seed=seed,
                      task="course")["episodes"][0]
    return {role: turn["reward"] for role, turn in played.items()}


def rss_mb(pid: int) -> float:
    """A process's resident memory in MB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class Server:
    """`python -m cory_env.openenv` in a child process on a free loopback port, logged to a file."""

    def __init__(self, log: Path, max_connections: int, idle_s: float):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url, self.log = f"http://127.0.0.1:{self.port}", log
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cory_env.openenv", "--task", "course", "--role", "observer",
             "--policy", "pioneer=openenv_load:pioneer", "--port", str(self.port),
             "--max-connections", str(max_connections), "--idle-timeout", str(idle_s)],
            cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"the server did not start:\n{log.read_text()}") from None
                time.sleep(0.1)

    def stop(self) -> int:
        """SIGTERM the server and return its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


def client(url: str):
    """OpenEnv's own client for the server."""
    from openenv.core import GenericEnvClient

    return GenericEnvClient(base_url=url)


async def good(url: str, seeds: list[int], truth: dict[int, dict]) -> int:
    """Play one episode per seed in one connection; every reward must be the text env's."""
    async with client(url) as env:
        for seed in seeds:
            result = await env.reset(seed=seed)
            answer = observer(seed)(result.observation["prompt"])
            result = await env.step({"answer": answer})
            got = result.observation["task_rewards"]
            if not result.done or got != truth[seed] or result.reward != sum(got.values()):
                raise AssertionError(f"seed {seed}: got {got} (reward {result.reward}), "
                                     f"the text env gives {truth[seed]}")
    return len(seeds)


async def raw(url: str):
    """A bare WebSocket connection to the server's /ws."""
    from websockets.asyncio.client import connect

    return await connect(url.replace("http", "ws") + "/ws")


BAD_FRAMES = [("garbage", "not JSON"), (b"\x00\x01", "binary frame"), ("[1, 2]", "JSON object"),
              ('{"type": "jump"}', "unknown message type 'jump'"),
              ('{"type": "step", "data": {"answer": "red"}}', "step before reset"),
              ('{"type": "step", "data": {"answr": "red"}}', "field 'answer'"),
              ('{"type": "step", "data": "red"}', "'data' must be a JSON object")]


async def bad(url: str, seed: int, truth: dict[int, dict]) -> int:
    """Bad frames answered by name, the connection then usable; a vanishing and a silent client."""
    ws = await raw(url)
    for frame, words in BAD_FRAMES:
        await ws.send(frame)
        reply = json.loads(await ws.recv())
        if reply["type"] != "error" or words not in reply["data"]["message"]:
            raise AssertionError(f"{frame!r} was answered {reply}, not an error naming {words!r}")
    await ws.send(json.dumps({"type": "reset", "data": {"seed": seed}}))
    prompt = json.loads(await ws.recv())["data"]["observation"]["prompt"]
    await ws.send(json.dumps({"type": "step", "data": {"answer": observer(seed)(prompt)}}))
    done = json.loads(await ws.recv())["data"]
    if done["observation"]["task_rewards"] != truth[seed]:
        raise AssertionError(f"after bad frames, seed {seed} gave {done}")
    await ws.close()
    ws = await raw(url)  # vanishes mid-episode, with no close frame
    await ws.send(json.dumps({"type": "reset", "data": {"seed": seed}}))
    await ws.recv()
    ws.transport.abort()
    ws = await raw(url)  # connects and leaves
    await ws.close()
    return 3


async def a_round(url: str, clients: int, episodes: int, first_seed: int) -> dict:
    """`clients` good clients and one bad one at once; the episodes played, connections opened."""
    seeds = [[first_seed + c * episodes + e for e in range(episodes)] for c in range(clients)]
    truth = {s: expected(s) for row in seeds for s in row}
    truth[first_seed - 1] = expected(first_seed - 1)
    t0 = time.perf_counter()
    done = await asyncio.gather(*(good(url, row, truth) for row in seeds),
                                bad(url, first_seed - 1, truth))
    return {"connections": clients + done[-1], "episodes": sum(done[:-1]) + 1,
            "seconds": time.perf_counter() - t0}


async def bound(url: str, max_connections: int) -> dict:
    """Hold every connection, see one more refused by name, then open one once they close."""
    held = [client(url) for _ in range(max_connections)]
    for env in held:
        await env.connect()
        await env.reset(seed=0)
    extra = client(url)
    try:
        await extra.reset(seed=0)
        refusal = ""
    except Exception as err:  # OpenEnv's client raises the server's error frame
        refusal = str(err)
    finally:
        await extra.close()
    for env in held:
        await env.close()
    for _ in range(50):  # the server ends the held connections as their closes arrive
        try:
            async with client(url) as env:
                await env.reset(seed=1)
            break
        except Exception:
            await asyncio.sleep(0.1)
    else:
        raise AssertionError("no connection opened after the held ones closed")
    return {"refusal": refusal, "connections": max_connections + 2}


async def idle(url: str, idle_s: float) -> dict:
    """A connection that goes quiet past the timeout is closed with 1001 and the reason."""
    from websockets.exceptions import ConnectionClosed

    ws = await raw(url)
    await ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
    await ws.recv()
    try:
        await asyncio.wait_for(ws.recv(), idle_s + 10)
        return {"code": None, "reason": "the server sent a frame instead of closing"}
    except ConnectionClosed as closed:
        return {"code": closed.rcvd.code if closed.rcvd else None,
                "reason": closed.rcvd.reason if closed.rcvd else ""}


async def stop_mid_episode(url: str, server: Server) -> dict:
    """SIGTERM while a client is mid-episode: the client sees 1012 and the server exits 0."""
    from websockets.exceptions import ConnectionClosed

    ws = await raw(url)
    await ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
    await ws.recv()
    server.proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(ws.recv(), 30)
        code = None
    except ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd else None
    return {"client_close_code": code, "exit_code": await asyncio.to_thread(server.proc.wait, 30)}


def run(clients: int = 16, episodes: int = 5, rounds: int = 4, idle_s: float = 3.0,
        log: Path | None = None) -> dict:
    """Start a server, load it and check it (module docstring); the figures and the checks."""
    log = log or Path(f"/tmp/openenv-load-{os.getpid()}.log")
    max_connections = clients + 4  # the good clients, the bad ones and a margin for closing ones
    server = Server(log, max_connections, idle_s)
    try:
        rows, opened = [], 0
        for r in range(rounds):
            row = asyncio.run(a_round(server.url, clients, episodes, 1 + r * 10_000))
            row.update(round=r + 1, episodes_per_s=row["episodes"] / row["seconds"],
                       server_rss_mb=rss_mb(server.proc.pid))
            rows.append(row)
            opened += row["connections"]
        checks = {"bound": asyncio.run(bound(server.url, max_connections)),
                  "idle": asyncio.run(idle(server.url, idle_s))}
        opened += checks["bound"]["connections"] + 1
        checks["sigterm"] = asyncio.run(stop_mid_episode(server.url, server))
        opened += 1
    finally:
        server.stop()
    text = log.read_text()
    connections = re.findall(r"^\S+ \S+ cory_env\.openenv: connection \d+ ", text, re.M)
    checks["log"] = {"connection_lines": len(connections), "connections_opened": opened,
                     "tracebacks": text.count("Traceback"),
                     "last_line": text.strip().splitlines()[-1]}
    return {"clients": clients, "episodes": episodes, "max_connections": max_connections,
            "idle_s": idle_s, "rounds": rows, "checks": checks, "log": str(log)}


def main(argv=None) -> None:
    """Run the load and print a table per round and the checks."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--episodes", type=int, default=5)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--idle-timeout", type=float, default=3.0)
    args = p.parse_args(argv)
    out = run(args.clients, args.episodes, args.rounds, args.idle_timeout)
    print("| round | connections | episodes | s | episodes/s | server memory (MB) |")
    print("|---|---|---|---|---|---|")
    for r in out["rounds"]:
        print(f"| {r['round']} | {r['connections']} | {r['episodes']} | {r['seconds']:.2f} | "
              f"{r['episodes_per_s']:.0f} | {r['server_rss_mb']:.0f} |")
    print(json.dumps(out["checks"], indent=1))


if __name__ == "__main__":
    main()
