"""The OpenEnv server as a service: bounded, checked, logged, idle-closed WebSocket connections.

`Connections(app, action_cls, max_connections=8, idle_s=300)` wraps OpenEnv's ASGI app
(`cory_env.openenv.app`) without changing its protocol:
- at most `max_connections` connections at once; one more gets an error frame ("server full:
  ...", code CAPACITY_REACHED, which OpenEnv's clients raise) and a close with 1013, try again
  later;
- a frame that is not a JSON object of a known type, or a step whose action does not fit
  `action_cls`, is answered with an error frame that names what is wrong, and the connection
  goes on;
- a connection that sends nothing for `idle_s` seconds is closed with 1001 and the reason;
- a client that leaves at any moment ends its connection quietly (no traceback in the log);
- each connection ends with one log line: number, peer, episodes, steps, errors, seconds, and why
  it ended (client closed, client vanished, idle, server stopping, refused).
`serve(connections, host, port)` runs it under uvicorn until SIGTERM or SIGINT, closes every
connection with 1012 (service restart), logs what it served and returns, so the process exits 0.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import time
from dataclasses import dataclass, field

from pydantic import BaseModel, ValidationError

log = logging.getLogger("cory_env.openenv")
TYPES = ("reset", "step", "state", "close", "mcp")  # OpenEnv's WebSocket message types
ENDINGS = {1000: "client closed", 1001: "client went away", 1012: "server stopping"}


@dataclass
class Connection:
    """One WebSocket client connection's counts, as its log line reports them."""

    number: int
    peer: str
    start: float = field(default_factory=time.monotonic)
    episodes: int = 0
    steps: int = 0
    errors: int = 0
    asked: str = ""  # the type of the last message passed to the app
    ended: str = ""  # why the connection ended, once known
    closed: bool = False  # a close was sent or the client is gone: nothing more to send

    def line(self) -> str:
        """The connection's one log line."""
        return (f"connection {self.number} {self.peer}: {self.episodes} episodes, "
                f"{self.steps} steps, {self.errors} errors, {time.monotonic() - self.start:.1f} s; "
                f"{self.ended or 'ended'}")


def error_frame(message: str, code: str) -> str:
    """An OpenEnv error frame (what its clients raise as 'Server error: ...'), compact as
    OpenEnv's own, so that every reply's type starts it the same way."""
    return json.dumps({"type": "error", "data": {"message": message, "code": code}},
                      separators=(",", ":"))


def named(err: ValidationError, action_cls: type[BaseModel]) -> str:
    """A validation error as one line naming each bad field, and the fields an action has."""
    fields = ", ".join(f"{n!r}" for n, f in action_cls.model_fields.items() if f.is_required())
    parts = "; ".join(f"field {'.'.join(map(str, e['loc'])) or '(the action)'!r}: {e['msg']}"
                      for e in err.errors())
    return f"bad action: {parts} (an action has the field(s) {fields})"


class Connections:
    """ASGI middleware that runs OpenEnv's WebSocket connections as a service (see the module)."""

    def __init__(self, app, action_cls: type[BaseModel], max_connections: int = 8,
                 idle_s: float = 300.0):
        self.check(max_connections, idle_s)
        self.app, self.action_cls = app, action_cls
        self.max_connections, self.idle_s = max_connections, float(idle_s)
        self.live: dict[int, Connection] = {}
        self.numbers = itertools.count(1)
        self.served = self.refused = 0

    @staticmethod
    def check(max_connections: int, idle_s: float) -> None:
        """Refuse a bound or a timeout that cannot serve anyone, naming the value."""
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) \
                or max_connections < 1:
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        if isinstance(idle_s, bool) or not isinstance(idle_s, (int, float)) or not idle_s > 0:
            raise ValueError(f"the idle timeout must be > 0 seconds, got {idle_s!r}")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        client = scope.get("client") or ("?", 0)
        connection = Connection(next(self.numbers), f"{client[0]}:{client[1]}")
        if len(self.live) >= self.max_connections:
            return await self._refuse(connection, receive, send)
        self.live[connection.number] = connection
        sender = self._sender(connection, send)
        try:
            await self.app(scope, self._receiver(connection, receive, sender), sender)
        except Exception:
            if not connection.closed:  # a fault while the client is still there: keep it loud
                connection.ended = connection.ended or "server error"
                raise
        finally:
            del self.live[connection.number]
            self.served += 1
            log.info(connection.line())

    async def _refuse(self, connection: Connection, receive, send) -> None:
        self.refused += 1
        reason = (f"server full: {self.max_connections} of {self.max_connections} connections in "
                  f"use; try again later")
        connection.ended = f"refused ({reason})"
        try:
            await receive()  # the handshake
            await send({"type": "websocket.accept"})
            try:  # answer the client's first message, so that its client raises our reason
                await asyncio.wait_for(receive(), min(self.idle_s, 10.0))
            except asyncio.TimeoutError:
                pass
            await send({"type": "websocket.send", "text": error_frame(reason, "CAPACITY_REACHED")})
            await send({"type": "websocket.close", "code": 1013, "reason": "server full"})
        except OSError:
            pass
        log.info(connection.line())

    def _receiver(self, connection: Connection, receive, send):
        """`receive` that answers bad frames itself (through the connection's `send`), closes
        idle connections and notes endings."""

        async def gated():
            while True:
                try:
                    message = await asyncio.wait_for(receive(), self.idle_s)
                except asyncio.TimeoutError:
                    connection.ended = f"idle for {self.idle_s:g} s"
                    await send({"type": "websocket.close", "code": 1001,
                                     "reason": connection.ended})
                    return {"type": "websocket.disconnect", "code": 1001}
                if message["type"] == "websocket.disconnect":
                    connection.closed = True
                    connection.ended = connection.ended or ENDINGS.get(message.get("code"),
                                                                 "client vanished")
                    return message
                if message["type"] != "websocket.receive":
                    return message
                problem = self._problem(message, connection)
                if problem is None:
                    return message
                await send({"type": "websocket.send",
                                 "text": error_frame(problem, "VALIDATION_ERROR")})

        return gated

    def _problem(self, message: dict, connection: Connection) -> str | None:
        """What is wrong with a client's frame, or None to pass it on."""
        text = message.get("text")
        if text is None:
            return "send text frames holding JSON; got a binary frame"
        try:
            frame = json.loads(text)
        except ValueError as err:
            return f"not JSON ({err}): {text[:60]!r}"
        if not isinstance(frame, dict):
            return f"a message is a JSON object with a 'type'; got a {type(frame).__name__}"
        kind, data = frame.get("type"), frame.get("data", {})
        if kind not in TYPES:
            return f"unknown message type {kind!r}; the types are {', '.join(TYPES)}"
        if not isinstance(data, dict):
            return f"a {kind} message's 'data' must be a JSON object; got {data!r:.60}"
        if kind == "step":
            try:
                self.action_cls.model_validate(data)
            except ValidationError as err:
                return named(err, self.action_cls)
        connection.asked = kind
        if kind == "close":
            connection.ended = "client closed"
        return None

    def _sender(self, connection: Connection, send):
        """`send` that counts replies and drops what cannot reach a gone client."""

        async def safe(message):
            if connection.closed:
                return
            if message["type"] == "websocket.close":
                connection.closed = True
            elif message["type"] == "websocket.send":
                reply = message.get("text") or ""
                if reply.startswith('{"type":"error"'):
                    connection.errors += 1
                elif reply.startswith('{"type":"observation"'):
                    connection.episodes += connection.asked == "reset"
                    connection.steps += connection.asked == "step"
            try:
                await send(message)
            except OSError:  # the client left while we answered
                connection.closed = True
                connection.ended = connection.ended or "client vanished"

        return safe


def check_port(host: str, port: int) -> None:
    """A ValueError naming the address when nothing can listen there (in use, or not this
    machine's), so the server says so before announcing itself."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as err:
        raise ValueError(f"--host {host} --port {port}: cannot listen there ({err.strerror}); "
                         f"choose another --port") from None


def serve(connections: Connections, host: str, port: int, log_level: str = "warning") -> None:
    """Serve until SIGTERM or SIGINT, close every connection (1012), log the totals and return."""
    import uvicorn

    caught: list[int] = []
    previous = {s: signal.signal(s, lambda n, _: caught.append(n))
                for s in (signal.SIGTERM, signal.SIGINT)}
    try:  # uvicorn handles the signal, then raises it again: ours records it instead
        uvicorn.run(connections, host=host, port=port, log_level=log_level,
                    timeout_graceful_shutdown=5)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    why = f" on {signal.Signals(caught[0]).name}" if caught else ""
    log.info(f"stopped{why}: {connections.served} connections served, "
             f"{connections.refused} refused")
