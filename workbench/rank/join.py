"""Joining a run from outside (``workbench rank --store HOST:PORT``): the checks of the arguments, then a wait for
the run's store bounded by ``--connect-timeout``, which Ctrl-C or SIGTERM end at once. No torch here: a mistake is
answered before torch is imported.

The wait speaks the first queries of torch's ``TCPStore`` client (``VALIDATE``, ``PING``, then ``WAIT`` and ``GET``
of the control server's address; :mod:`workbench.supervisor.store`); refused connections are retried until the
deadline. Errors are one line: :class:`~workbench.base.errors.ConfigError` or :class:`JoinError`, both exit 2.
Details: docs/internals.md.
"""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from workbench.base.errors import ConfigError, WorkbenchError
from workbench.base.protocol import CONTROL_KEY
from workbench.base.tcpstore_wire import GET, KEY_PREFIX, MAGIC, PING, STOP_WAITING, VALIDATE, WAIT

KEY = (KEY_PREFIX + CONTROL_KEY).encode()
_U32, _U64 = struct.Struct("=I"), struct.Struct("=Q")  # the machine's byte order, as torch's client sends
_RETRY_S = 0.2
_ADDRESS = "HOST:PORT with a port in 1..65535 (IPv6: [ADDRESS]:PORT)"


class JoinError(WorkbenchError):
    """No run answered at the store's address in time."""


@dataclass(frozen=True)
class Joined:
    """The run found at ``store``: its control server's address, and what the rank asks it for."""

    store: str
    control_host: str
    control_port: int
    rank_hint: int | None
    timeout: float


def parse_address(text: Any, what: str = "--store") -> tuple[str, int]:
    """``HOST:PORT`` (``[ADDR]:PORT`` for IPv6) -> (host, port), or a ConfigError saying what is allowed."""
    if not isinstance(text, str):
        raise ConfigError(what, f"must be {_ADDRESS}, got {type(text).__name__} {text!r}")
    host, colon, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not host or re.search(r"[\s\[\]/]", host) or not re.fullmatch(r"[0-9]{1,5}", port):
        raise ConfigError(what, f"{text!r} is not {_ADDRESS}")
    if not 1 <= int(port) <= 65535:
        raise ConfigError(what, f"port {int(port)} in {text!r} is out of range: allowed 1..65535")
    return host, int(port)


def parse_timeout(value: Any) -> float:
    """Seconds to wait for the run: a finite number > 0."""
    try:
        seconds = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    except ValueError:
        seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError("--connect-timeout", f"{value!r} is not allowed: a finite number of seconds > 0")
    return seconds


def parse_rank_hint(value: Any) -> int | None:
    """The rank number to ask for (None: any free slot): an integer >= 0."""
    if value is None:
        return None
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"[0-9]{1,6}", text):
        raise ConfigError("--rank-hint", f"{value!r} is not allowed: a rank number >= 0 (default: $RANK if set)")
    return int(text)


def join_run(store: Any, timeout: Any = 60.0, rank_hint: Any = None) -> Joined:
    """Check the arguments, then wait up to ``timeout`` seconds for the run whose store listens at ``store``."""
    host, port = parse_address(store)
    seconds = parse_timeout(timeout)
    hint = parse_rank_hint(rank_hint)
    control = wait_for_run(host, port, seconds)
    control_host, control_port = parse_address(control, "the store's control address")
    return Joined(store, control_host, control_port, hint, seconds)


def join_or_exit(store: Any, timeout: Any = 60.0, rank_hint: Any = None) -> Joined:
    """:func:`join_run` for a process of its own: an error is one line on stderr and exit 2; SIGINT or SIGTERM
    during the wait end the process at once (exit 130), without a traceback."""
    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return join_run(store, timeout, rank_hint)
    except WorkbenchError as exc:
        _exit(f"workbench: error: {exc}", 2)
    except KeyboardInterrupt:
        _exit(f"workbench: interrupted while waiting for the run at {store}", 130)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _exit(line: str, code: int) -> None:
    print(line, file=sys.stderr, flush=True)
    raise SystemExit(code)


def wait_for_run(host: str, port: int, timeout: float) -> str:
    """The control server's ``HOST:PORT`` that the store at ``host:port`` holds, or a JoinError once ``timeout``
    seconds have passed. The attempts run in a thread of their own (a name lookup or a connect can block in C);
    this thread only waits, so a signal's handler runs at once."""
    # reason: what the last attempt that ended found; pending: what the attempt under way has found so far (at the
    # deadline an attempt may be under way: it says why only if it got further than a connect, or none ended)
    state: dict[str, Any] = {"reason": None, "pending": "nothing answered"}
    done = threading.Event()
    deadline = time.monotonic() + timeout

    def attempts() -> None:
        try:
            state["control"] = _attempts(host, port, deadline, state)
        except JoinError as exc:
            state["error"] = exc
        finally:
            done.set()

    threading.Thread(target=attempts, name="workbench-join", daemon=True).start()
    done.wait(timeout)
    if state.get("control"):
        return state["control"]
    if "error" in state:
        raise state["error"]
    reason = state["reason"] or state["pending"]
    raise JoinError(f"no workbench run answered at {_show(host, port)} within {timeout:g} s ({reason})") from None


def _show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _NotAStore(WorkbenchError):
    """Another program answered: waiting longer will not make it a run's store."""


class _Closed(WorkbenchError):
    """The peer closed the connection without a word (a store going down, a program that refuses): retried."""


def _attempts(host: str, port: int, deadline: float, state: dict[str, Any]) -> str | None:
    while True:
        try:
            return _handshake(host, port, deadline, state)
        except socket.gaierror as exc:
            state["reason"] = f"cannot resolve {host!r}: {exc.strerror}"
            if exc.errno != socket.EAI_AGAIN:
                raise JoinError(f"no workbench run at {_show(host, port)}: {state['reason']}") from None
        except _NotAStore as exc:
            state["reason"] = str(exc)
            raise JoinError(f"no workbench run answered at {_show(host, port)} ({exc})") from None
        except TimeoutError:
            state["reason"] = state["pending"]  # the step that timed out
        except _Closed:
            pass  # its reason is in state
        except ConnectionRefusedError:
            state["reason"] = "connection refused: nothing listens there"
        except OSError as exc:
            state["reason"] = exc.strerror or type(exc).__name__
        left = deadline - time.monotonic()
        if left <= 0:
            return None  # the waiting thread has given up already
        time.sleep(min(_RETRY_S, left))


def _handshake(host: str, port: int, deadline: float, state: dict[str, Any]) -> str:
    state["pending"] = "the connection attempt got no answer"
    with socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.001)) as sock:
        state["reason"] = state["pending"] = ("a program there accepted the connection but did not answer the "
                                              "store's handshake")
        # no newline in the nonce: a line-based server (HTTP, SMTP) then always waits, never answers by chance
        nonce = int.from_bytes(bytes(b if b != 0x0A else 0x0B for b in os.urandom(4)), "little")
        sock.sendall(bytes([VALIDATE]) + _U32.pack(MAGIC) + bytes([PING]) + _U32.pack(nonce))
        echo = _recv(sock, 4, deadline, state)
        if echo != _U32.pack(nonce):
            raise _NotAStore(f"another program listens there: it answered {_peek(sock, echo)}")
        state["reason"] = state["pending"] = "a store answered, but no workbench run's control address is in it"
        sock.sendall(bytes([WAIT]) + _U64.pack(1) + _U64.pack(len(KEY)) + KEY)
        if _recv(sock, 1, deadline, state) != bytes([STOP_WAITING]):
            raise _NotAStore("a store answered WAIT with something else than torch's TCPStore does")
        sock.sendall(bytes([GET]) + _U64.pack(len(KEY)) + KEY)
        size = _U64.unpack(_recv(sock, 8, deadline, state))[0]
        if size > 1024:
            raise _NotAStore(f"the store's control address is {size} bytes long")
        return _recv(sock, size, deadline, state).decode(errors="replace")


def _recv(sock: socket.socket, n: int, deadline: float, state: dict[str, Any]) -> bytes:
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(n - len(data))
        if not chunk:
            if data:
                raise _NotAStore(f"another program listens there: it answered {ascii(data)} and closed")
            state["reason"] = state["pending"] = ("a program there closed the connection without answering the "
                                                  "store's handshake")
            raise _Closed
        data += chunk
    return data


def _peek(sock: socket.socket, first: bytes) -> str:
    """The first bytes another program answered, for the message (what it sent within 0.2 s)."""
    sock.settimeout(0.2)
    try:
        first += sock.recv(36)
    except OSError:
        pass
    return ascii(first[:40])
