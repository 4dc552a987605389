"""The run's rendezvous store: a server for torch's ``TCPStore`` clients, written in Python so that the process that
supervises a run (a CLI, a notebook kernel, a sweep worker) need not import torch.

It speaks torch's ``TCPStore`` wire protocol (``c10d/TCPStoreLibUvBackend.cpp``): ``VALIDATE``, then one command byte
per query (``SET``, ``GET``, ``ADD``, ``WAIT``, ``CHECK``, ``COMPARE_SET``, ``PING``, ``LIST_KEYS``, ``BARRIER``, the
queue commands ...). One thread serves every connection (``selectors``); a waiting client is answered when its last key
is set; a connection that breaks the protocol is closed. The commands and replies: docs/internals.md.
"""

from __future__ import annotations

import selectors
import socket
import struct
import sys
import threading
from collections import defaultdict, deque

from workbench.base import tcpstore_wire as wire
from workbench.base.errors import WorkbenchError

_ORDER = "<" if sys.byteorder == "little" else ">"
_U32, _U64, _I64 = struct.Struct(_ORDER + "I"), struct.Struct(_ORDER + "Q"), struct.Struct(_ORDER + "q")
_MAX_LEN = 1 << 30  # a key or value longer than this is a broken client, not a rendezvous


class _Incomplete(WorkbenchError):
    """The buffer holds only part of the next query: wait for more bytes."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise _Incomplete
        chunk = self.data[self.pos: self.pos + n]
        self.pos += n
        return chunk

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def u64(self) -> int:
        return _U64.unpack(self.take(8))[0]

    def i64(self) -> int:
        return _I64.unpack(self.take(8))[0]

    def blob(self) -> bytes:
        size = self.u64()
        if size > _MAX_LEN:
            raise ValueError(f"a key or value of {size} bytes")
        return self.take(size)


def _blob(value: bytes) -> bytes:
    return _U64.pack(len(value)) + value


class _Client:
    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.inbox = b""
        self.outbox = b""
        self.validated = False
        self.awaited = 0  # keys of its WAIT still missing


class StoreServer:
    """Serve the store on ``listen`` (a bound, listening socket) from a thread of its own."""

    def __init__(self, listen: socket.socket) -> None:
        self.listen = listen
        self.data: dict[str, bytes] = {}
        self.queues: dict[str, deque[bytes]] = defaultdict(deque)
        self._waiting: dict[str, list[_Client]] = defaultdict(list)
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._closed = False
        listen.setblocking(False)
        self._sel.register(listen, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._serve, name="workbench-store", daemon=True)
        self._thread.start()

    # -- in-process use (the supervisor's own keys), named as a torch client names them ---------------------------
    def set(self, key: str, value: str | bytes) -> None:
        with self._lock:
            self._set(wire.KEY_PREFIX + key, value.encode() if isinstance(value, str) else value)
        self._wake()

    def get(self, key: str) -> bytes:
        with self._lock:
            return self.data[wire.KEY_PREFIX + key]

    def close(self) -> None:
        self._closed = True
        self._wake()
        self._thread.join(timeout=5)

    # -- the loop -----------------------------------------------------------------------------------------------
    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _serve(self) -> None:
        try:
            while not self._closed:
                for key, events in self._sel.select(1.0):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        self._wake_r.recv(4096)
                    elif events & selectors.EVENT_READ:
                        self._read(key.data)
                with self._lock:
                    self._flush_all()
        finally:
            for key in list(self._sel.get_map().values()):
                if isinstance(key.data, _Client):
                    key.data.conn.close()
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _accept(self) -> None:
        try:
            conn, _ = self.listen.accept()
        except (BlockingIOError, OSError):
            return
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sel.register(conn, selectors.EVENT_READ, _Client(conn))

    def _read(self, client: _Client) -> None:
        try:
            data = client.conn.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        with self._lock:
            if not data:
                self._drop(client)
                return
            client.inbox += data
            try:
                while client.inbox:
                    reader = _Reader(client.inbox)
                    try:
                        self._query(client, reader)
                    except _Incomplete:
                        break
                    client.inbox = client.inbox[reader.pos:]
            except ValueError:
                self._drop(client)

    def _drop(self, client: _Client) -> None:
        self._forget(client)  # the caller holds the lock
        try:
            self._sel.unregister(client.conn)
        except (KeyError, ValueError):
            pass
        client.conn.close()

    def _flush_all(self) -> None:
        """Send what every client is owed; a client whose socket is full is also watched for writability."""
        for key in list(self._sel.get_map().values()):
            client = key.data
            if not isinstance(client, _Client):
                continue
            if client.outbox:
                try:
                    sent = client.conn.send(client.outbox)
                    client.outbox = client.outbox[sent:]
                except BlockingIOError:
                    pass
                except OSError:
                    self._drop(client)
                    continue
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.outbox else 0)
            if key.events != events:
                self._sel.modify(client.conn, events, client)

    # -- the queries (under the lock) ----------------------------------------------------------------------------
    def _query(self, client: _Client, r: _Reader) -> None:
        """One query, or _Incomplete before anything is changed (the whole query is parsed first)."""
        command = r.take(1)[0]
        if not client.validated:
            if command != wire.VALIDATE or r.u32() != wire.MAGIC:
                raise ValueError("the first query must be VALIDATE with torch's magic number")
            client.validated = True
            return
        if command == wire.PING:
            client.outbox += _U32.pack(r.u32())
        elif command in (wire.SET, wire.APPEND, wire.QUEUE_PUSH):
            key, value = r.blob().decode(), r.blob()
            if command == wire.SET:
                self._set(key, value)
            elif command == wire.APPEND:
                self._set(key, self.data.get(key, b"") + value)
            else:
                self.queues[key].append(value)
                self._wake_waiters(key, one=True)
        elif command == wire.MULTI_SET:
            pairs = [(r.blob().decode(), r.blob()) for _ in range(r.u64())]
            for key, value in pairs:
                self._set(key, value)
        elif command == wire.GET:
            client.outbox += _blob(self.data.get(r.blob().decode(), b""))
        elif command == wire.MULTI_GET:
            keys = [r.blob().decode() for _ in range(r.u64())]
            client.outbox += b"".join(_blob(self.data.get(k, b"")) for k in keys)
        elif command == wire.COMPARE_SET:
            key, expected, desired = r.blob().decode(), r.blob(), r.blob()
            current = self.data.get(key)
            if (current is None and expected == b"") or current == expected:
                self.data[key] = current = desired
            self._wake_waiters(key)  # as torch's server does, whether or not the value changed
            client.outbox += _blob(expected if current is None else current)
        elif command == wire.ADD:
            key, amount = r.blob().decode(), r.i64()
            value = int(self.data.get(key, b"0")) + amount
            self._set(key, str(value).encode())
            client.outbox += _I64.pack(value)
        elif command in (wire.CHECK, wire.WAIT, wire.CANCEL_WAIT, wire.BARRIER):
            self._query_wait(client, command, r)
        elif command == wire.GETNUMKEYS:
            client.outbox += _I64.pack(len(self.data))
        elif command == wire.LIST_KEYS:  # the keys as sent (torch's client keeps those under its own prefix)
            client.outbox += _I64.pack(len(self.data)) + b"".join(_blob(k.encode()) for k in self.data)
        elif command == wire.DELETE_KEY:
            client.outbox += _I64.pack(1 if self.data.pop(r.blob().decode(), None) is not None else 0)
        elif command == wire.QUEUE_LEN:
            client.outbox += _I64.pack(len(self.queues.get(r.blob().decode(), ())))
        elif command == wire.QUEUE_POP:  # the client waited for the queue's key first: answer at once
            queue = self.queues[r.blob().decode()]
            client.outbox += _I64.pack(len(queue)) + (_blob(queue.popleft()) if queue else b"")
        else:
            raise ValueError(f"unknown store command {command}")

    def _query_wait(self, client: _Client, command: int, r: _Reader) -> None:
        """``CHECK``, ``WAIT``, ``CANCEL_WAIT`` and ``BARRIER``: the queries that may leave a client waiting."""
        if command == wire.CANCEL_WAIT:
            self._forget(client)
            client.outbox += bytes([wire.WAIT_CANCELED])
        elif command == wire.BARRIER:  # as torch's server: the key counts the callers; the last one releases them all
            key, world = r.blob().decode(), r.i64()
            count = int(self.data.get(key, b"0")) + 1
            self.data[key] = str(count).encode()  # no wake-up before the last caller
            if count >= world:
                self._wake_waiters(key)
                client.outbox += bytes([wire.STOP_WAITING])
            else:
                client.awaited = 1
                self._waiting[key].append(client)
        else:
            keys = [r.blob().decode() for _ in range(r.u64())]
            ready = all(k in self.data or self.queues.get(k) for k in keys)  # a non-empty queue counts
            if command == wire.CHECK:
                client.outbox += bytes([wire.READY if ready else wire.NOT_READY])
            elif ready:
                client.outbox += bytes([wire.STOP_WAITING])
            else:
                missing = [k for k in keys if k not in self.data]
                client.awaited = len(missing)
                for key in missing:
                    self._waiting[key].append(client)

    def _set(self, key: str, value: bytes) -> None:
        self.data[key] = value
        self._wake_waiters(key)

    def _wake_waiters(self, key: str, one: bool = False) -> None:
        """Count ``key`` as arrived for the clients waiting on it (``one``: the first that completes only, for a
        queue's item); a client whose every key arrived is told to stop waiting."""
        waiters = self._waiting.get(key, [])
        for client in list(waiters):
            client.awaited -= 1
            if client.awaited == 0:
                client.outbox += bytes([wire.STOP_WAITING])
                if one:
                    waiters.remove(client)
                    return
        if not one:
            self._waiting.pop(key, None)

    def _forget(self, client: _Client) -> None:
        """Stop waiting for ``client`` (it cancelled, or its connection ended)."""
        for waiters in self._waiting.values():
            while client in waiters:
                waiters.remove(client)
        client.awaited = 0
