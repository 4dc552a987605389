"""Control server: the supervisor's end of the control channel (:mod:`workbench.base.protocol`) — its sockets, the
framing, and a wake-up for commands from other threads.

``poll(timeout)`` waits on every connection at once and returns what happened, in order: ``("hello", conn,
messages)`` for a new connection's first message (and whatever came with it), ``("message", worker, m)`` for each
message of a known rank, ``("closed", worker)`` when a rank's connection ends (the kernel closes it once the
dead process's memory is freed: docs/benchmarks.md), ``("wake", None)`` when ``wake()`` was called. A connection
whose first message is not ``hello`` is closed.
"""

from __future__ import annotations

import select
import selectors
import socket
from dataclasses import dataclass, field
from typing import Any

from workbench.base.errors import RunStartError
from workbench.base.protocol import CONTROL, RANK, LineDecoder, ProtocolError, encode, message
from workbench.supervisor.launcher import Worker
from workbench.supervisor.store import StoreServer


def open_store(host: str, port: int) -> tuple[StoreServer, socket.socket]:
    """The run's rendezvous store (:mod:`.store`: torch ``TCPStore`` clients, gloo's rendezvous), listening on
    ``host:port`` (0: a free port) only."""
    listen = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listen.bind((host, port))
    except OSError as exc:
        listen.close()
        raise RunStartError(f"cannot listen on {host}:{port} ({exc.strerror}): choose another --store-port, or "
                            "a --bind address of this machine") from None
    listen.listen(256)
    return StoreServer(listen), listen


def _says_hello(first: dict[str, Any]) -> bool:
    try:
        kind = CONTROL.received(first, RANK)
    except ProtocolError:
        return False
    return kind == "hello"


@dataclass
class Pending:
    """A connection that has not said hello yet."""

    conn: socket.socket
    decoder: LineDecoder = field(default_factory=LineDecoder)


class ControlServer:
    def __init__(self, host: str, family: int) -> None:
        self.server = socket.socket(family)
        self.server.bind((host, 0))
        self.server.listen(256)
        self.server.setblocking(False)
        self.address = f"{host}:{self.server.getsockname()[1]}"
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        self._refused: list[socket.socket] = []
        self._sel.register(self.server, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")

    def wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def poll(self, timeout: float) -> list[tuple[str, Any, Any]]:
        happened: list[tuple[str, Any, Any]] = []
        for key, _ in self._sel.select(timeout):
            if key.data == "accept":
                self._accept()
            elif key.data == "wake":
                self._wake_r.recv(4096)
                happened.append(("wake", None, None))
            else:
                happened += self._read(key.data)
        return happened

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except BlockingIOError:
                return
            conn.setblocking(True)
            conn.settimeout(5.0)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sel.register(conn, selectors.EVENT_READ, Pending(conn))

    def _read(self, who: Pending | Worker) -> list[tuple[str, Any, Any]]:
        conn = who.conn
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if isinstance(who, Pending):
            messages = who.decoder.feed(data) if data else []
            if not data or (messages and not _says_hello(messages[0])):
                self.drop(conn)
                return []
            return [("hello", who, messages)] if messages else []
        if not data:
            self.forget(conn)
            return [("closed", who, None)]
        return [("message", who, m) for m in who.decoder.feed(data)]

    def attach(self, worker: Worker, pending: Pending) -> None:
        """The connection of ``pending`` belongs to ``worker`` from now on."""
        worker.conn, worker.decoder = pending.conn, pending.decoder
        self._sel.modify(pending.conn, selectors.EVENT_READ, worker)

    def drain(self, worker: Worker) -> list[dict[str, Any]]:
        """What an exited rank sent before it ended (its last messages may still be in the socket)."""
        messages: list[dict[str, Any]] = []
        while worker.conn is not None and select.select([worker.conn], [], [], 0)[0]:
            try:
                data = worker.conn.recv(65536)
            except OSError:
                break
            if not data:
                break
            messages += worker.decoder.feed(data)
        return messages

    def send(self, worker: Worker | None, sent: dict[str, Any]) -> None:
        """Send ``worker`` a message built by :func:`workbench.base.protocol.message`."""
        if worker is None or worker.conn is None:
            return
        try:
            worker.conn.sendall(encode(sent))
        except OSError:
            pass  # its death is noticed by the watch loop

    def refuse(self, pending: Pending, reason: str) -> None:
        """Tell a joining rank why it cannot join. The connection is half-closed, not closed: closing a socket
        with unread data (a heartbeat in flight) resets it, and the reset can destroy the refusal before the rank
        reads it; the rank exits on reading it and the socket is closed with the server."""
        self.forget(pending.conn)
        try:
            pending.conn.sendall(encode(message("stop", reason=reason, refused=True)))
            pending.conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._refused.append(pending.conn)

    def forget(self, conn: socket.socket | None) -> None:
        if conn is None:
            return
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass

    def drop(self, conn: socket.socket) -> None:
        self.forget(conn)
        conn.close()

    def close(self) -> None:
        for sock in (self.server, self._wake_r, self._wake_w, *self._refused):
            sock.close()
        self._sel.close()
