"""The rank template (a "zygote"): one process that imported torch and the rank code once and forks rank processes
on request, so a rank starts in milliseconds instead of paying torch's import. This module is the owner's side;
the template's own process: :mod:`workbench.supervisor.template_server`.

Protocol: JSON lines over the template's stdin/stdout (the kinds of :data:`workbench.base.protocol.TEMPLATE_KINDS`),
and the same over a shared template's Unix socket (:func:`share`, ``WORKBENCH_TEMPLATE``). It runs no torch op
and starts no thread before forking, and never imports the user's code. No orphans: forked ranks die with the
template, the template with its owner. Details: docs/internals.md.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from workbench.base.errors import WorkbenchError
from workbench.base.processes import RANK_ENV_DEFAULTS, THREAD_ENV, child_env, import_path, kill_session
from workbench.base.protocol import TEMPLATE, TEMPLATE_PROCESS, LineDecoder, ProtocolError, encode
from workbench.supervisor.template_server import IN_TEMPLATE, code_fingerprint, identity

SHARED_VAR = "WORKBENCH_TEMPLATE"  # the address of a template this process and its children fork their ranks from
UNSHARED = "none:"  # SHARED_VAR's start where none could be shared, then why: each run says so


class TemplateError(WorkbenchError, RuntimeError):
    """The template could not be started or could not fork a rank."""


class ForkedProcess:
    """A rank forked by a template: the part of ``subprocess.Popen`` the supervisor uses (pid, poll, wait, kill)."""

    def __init__(self, template: Template, pid: int) -> None:
        self.template = template
        self.pid = pid
        self.returncode: int | None = None
        self.cpu_s: float | None = None  # the CPU seconds it spent in all, once reaped
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.returncode is not None:
            return
        if not self.template.remote:
            kill_session(self.pid)
        self.template.request(TEMPLATE.message("kill", pid=self.pid))

    def _end(self, code: int, cpu_s: float | None = None) -> None:
        if self.returncode is None:
            self.cpu_s = cpu_s  # before the code: whoever sees it ended finds its CPU too
            self.returncode = code
        self._ended.set()


class Template:
    """The owner's handle on one template process: ``fork()`` a rank, learn its exit code.

    ``prefix``: a host's launch line (empty: this machine). ``listen``: a listening Unix socket the template
    serves too (:func:`share`; this process's copy is closed once the template has it). The template is started,
    and its output read, by a thread of its own that lives until the template ends, so its parent-death signal
    fires only with this process. ``notice``: what a run using it says about it in a ``template`` event (None:
    nothing to say)."""

    def __init__(self, prefix: Sequence[str] = (), stderr: Any = None, ready_timeout: float = 120.0,
                 listen: socket.socket | None = None) -> None:
        self.prefix = list(prefix)
        self.remote = bool(prefix)
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None
        self.alive = True
        self.reason = ""
        self.address: str | None = None
        self.code: str | None = None  # a shared template's: workbench's files as they were when it started
        self.notice: str | None = None
        self.ready_timeout = ready_timeout
        self._stderr = stderr
        self._listen = listen
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._waiting: dict[int, dict[str, Any]] = {}  # token -> reply
        self._replied = threading.Condition(self._lock)
        self._children: dict[int, ForkedProcess] = {}
        self._token = 0
        self._started = threading.Event()
        threading.Thread(target=self._own, name="workbench-template", daemon=True).start()
        self._started.wait()

    # the owner thread: start, then read until the template ends
    def _own(self) -> None:
        env = child_env(THREAD_ENV)
        listen = [] if self._listen is None else ["--listen-fd", str(self._listen.fileno())]
        try:
            self.proc = subprocess.Popen([*self.prefix, sys.executable, "-m", "workbench.supervisor.template", *listen],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
                                         start_new_session=True, bufsize=0,
                                         pass_fds=() if self._listen is None else (self._listen.fileno(),))
        except OSError as exc:
            self._fail(f"cannot start the rank template ({exc.strerror})")
            return
        finally:
            if self._listen is not None:
                self._listen.close()  # the template's now: the socket ends with it
            self._started.set()
        self._read(lambda: os.read(self.proc.stdout.fileno(), 65536))  # type: ignore[union-attr]
        kill_session(self.proc.pid)  # a template that stopped talking is of no use: make sure it is gone
        code = self.proc.wait()
        self._fail(f"the rank template was killed ({signal.Signals(-code).name})" if code < 0
                   else f"the rank template exited with code {code}")

    def _read(self, read: Any) -> None:
        decoder = LineDecoder()
        while True:
            try:
                data = read()
            except (OSError, ValueError):
                data = b""
            if not data:
                return
            try:
                for message in decoder.feed(data):
                    self._on_message(message)
            except ProtocolError as exc:  # a template of another workbench version
                self._fail(str(exc))
                return

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = TEMPLATE.received(message, TEMPLATE_PROCESS)
        if kind == "ready":
            self.pid = message["pid"]
            self._ready.set()
        elif kind in ("forked", "fork_failed", "usage_answer"):
            with self._lock:
                self._waiting[message["token"]] = message
                if kind == "forked":
                    self._children[message["pid"]] = ForkedProcess(self, message["pid"])
                self._replied.notify_all()
        elif kind == "exit":
            with self._lock:
                child = self._children.pop(message["pid"], None)
            if child is not None:
                child._end(message["code"], message.get("cpu_s"))

    def _fail(self, reason: str) -> None:
        with self._lock:
            self.alive = False
            self.reason = self.reason or reason
            children, self._children = list(self._children.values()), {}
            self._replied.notify_all()
        for child in children:  # the template kills its ranks when it ends (or they die with it)
            child._end(-signal.SIGKILL)
        self._ready.set()

    def request(self, message: dict[str, Any]) -> None:
        with self._lock:
            if self.alive:
                self._write(encode(message))

    def _write(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)  # type: ignore[union-attr]
        except (OSError, ValueError, AttributeError):
            pass  # its end is noticed by the owner thread

    def _ask(self, kind: str, deadline: float, what: str, **fields: Any) -> dict[str, Any]:
        """Send a request with a fresh token and wait for the reply that carries it (TemplateError if none)."""
        with self._lock:
            self._token += 1
            token = self._token
        self.request(TEMPLATE.message(kind, token=token, **fields))
        with self._lock:
            while token not in self._waiting:
                if not self.alive:
                    raise TemplateError(self.reason)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TemplateError(f"the rank template did not {what}")
                self._replied.wait(remaining)
            return self._waiting.pop(token)

    def fork(self, argv: list[str], log: str | None, title: str, env: dict[str, str] | None = None,
             timeout: float = 30.0) -> ForkedProcess:
        """Fork a rank running ``workbench.rank.main.main(argv)``; raises TemplateError when it cannot."""
        deadline = time.monotonic() + timeout
        if not self._ready.wait(max(0.0, self.ready_timeout)):
            raise TemplateError(f"the rank template was not ready within {self.ready_timeout:g} s")
        reply = self._ask("fork", deadline, f"fork within {timeout:g} s", argv=argv, log=log, title=title,
                          cwd=os.getcwd(), env={**RANK_ENV_DEFAULTS, **os.environ, **THREAD_ENV, **(env or {})},
                          path=import_path())
        if reply["type"] == "fork_failed":
            raise TemplateError(f"the rank template could not fork: {reply['message']}")
        with self._lock:
            return self._children.get(reply["pid"]) or _ended(self, reply["pid"])

    def children_cpu(self, timeout: float = 5.0) -> float | None:
        """CPU seconds of the ranks this template reaped so far, whoever asked for them (None: no answer)."""
        if self.proc is None:
            return None
        if not self._ready.is_set():
            return 0.0  # still importing: nothing forked, nothing reaped
        try:
            return float(self._ask("usage", time.monotonic() + timeout, "answer")["cpu_s"])
        except TemplateError:
            return None

    def close(self) -> None:
        """Let the template go: it kills what it forked and exits."""
        with self._lock:
            proc = self.proc
        if proc is None:
            return
        try:
            proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kill_session(proc.pid)
            proc.wait(timeout=5)


class SharedTemplate(Template):
    """A connection to a template another process owns and shares (:func:`share`), at ``address``: forks as a
    :class:`Template` does. Its ranks are that template's children; they are SIGKILLed when this connection
    ends. TemplateError at once when nothing listens there; a template of another Python or workbench fails
    the handle (``alive`` False, ``reason`` says why) when its ``ready`` arrives."""

    def __init__(self, address: str, ready_timeout: float = 120.0) -> None:
        self._at = address  # before the reading thread starts: its "ready" names it
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(_sockaddr(address))
        except OSError as exc:
            self._sock.close()
            raise TemplateError(f"nothing answers at {address} ({exc.strerror or exc})") from None
        super().__init__(ready_timeout=ready_timeout)
        self.address = address

    def _own(self) -> None:
        self._started.set()
        self._read(lambda: self._sock.recv(65536))
        self._fail("the shared rank template closed the connection (it died, or its owner ended)")

    def _on_message(self, message: dict[str, Any]) -> None:
        if message["type"] == "ready":
            mine = identity()
            theirs = {k: message.get(k) for k in mine}
            if theirs != mine:
                self._fail("workbench's files changed since it started" if theirs["code"] != mine["code"]
                           and {**theirs, "code": None} == {**mine, "code": None}
                           else f"it runs another Python or workbench ({theirs}, here {mine})")
                self.close()
                return
            self.notice = (f"ranks forked by the shared rank template pid {message['pid']} ({self._at}), "
                           "not by one of this process's own")
        super()._on_message(message)

    def _write(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError:
            pass  # its end is noticed by the reading thread

    def usable(self) -> bool:
        """Wait (up to ``ready_timeout``) until the template is ready; whether it can be used."""
        return self._ready.wait(self.ready_timeout) and self.alive

    def children_cpu(self, timeout: float = 5.0) -> float | None:
        return None  # its owner's to ask

    def close(self) -> None:
        """End the connection: the template kills the ranks asked for over it."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _ended(template: Template, pid: int) -> ForkedProcess:
    """A rank that ended before its fork was acknowledged (its exit message came first)."""
    child = ForkedProcess(template, pid)
    child._end(-signal.SIGKILL)
    return child


def _sockaddr(address: str) -> str:
    """``@name`` is Linux's abstract namespace (no file to remove); anything else a path."""
    return "\0" + address[1:] if address.startswith("@") else address


def share(ready_timeout: float = 120.0) -> Template:
    """Start a rank template that this process owns and every process of this user may fork ranks from, over the
    abstract Unix socket in its ``address`` (put it in ``WORKBENCH_TEMPLATE`` for the processes that should);
    TemplateError where such a socket cannot be made (not Linux: put ``none: WHY`` there instead, :data:`UNSHARED`).
    Its ``code`` is :func:`code_fingerprint` at its start."""
    address = f"@workbench-template-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(_sockaddr(address))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise TemplateError(f"its socket {address} cannot be made ({exc.strerror or exc})") from None
    code = code_fingerprint()  # before it starts: a file changed while it imports counts as changed
    template = Template(ready_timeout=ready_timeout, listen=sock)
    template.address, template.code = address, code
    return template


_local: Template | None = None
_local_lock = threading.Lock()


def local_template(wait: bool = True) -> Template:
    """This process's template for ranks on this machine: started on first use, reused by every later run
    (a notebook kernel, a sweep worker, a benchmark), started anew if it died (its ``notice`` says so). Where
    ``WORKBENCH_TEMPLATE`` names a shared template, a connection to it instead; one that cannot be used (``wait``:
    waiting until it is ready) gives way to a template of this process's own, whose ``notice`` says why."""
    global _local
    if os.environ.get(IN_TEMPLATE):
        # a template never starts one: something its imports ran (e.g. a script named like a module torch imports,
        # `numbers.py`, on the path) would otherwise start templates without end
        raise TemplateError("a rank template may not start a run: one of its imports started one (is a file of "
                            f"yours shadowing a module torch imports? sys.path: {sys.path[:3]})")
    with _local_lock:
        if _local is None or not _local.alive:
            dead, _local = _local, _connect(os.environ.get(SHARED_VAR))
            if dead is not None:  # the next run starts slower (a new template imports torch): said, with why
                _local.notice = "; ".join(filter(None, [
                    f"the rank template pid {dead.pid} of this process died earlier ({dead.reason}): a new one was "
                    "started (its torch import is on this run's start)", _local.notice]))
        template = _local
    if not wait or not isinstance(template, SharedTemplate) or template.usable():
        return template
    with _local_lock:
        if _local is template:
            template.close()
            _local = _own_instead(template.address, template.reason or
                                  f"it was not ready within {template.ready_timeout:g} s")
        return _local


def _connect(address: str | None) -> Template:
    if not address:
        return Template()
    if address.startswith(UNSHARED):  # whoever started this process could not share one: said in every run
        own = Template()
        own.notice = (f"no shared rank template ({address[len(UNSHARED):].strip()}): this process started its own "
                      "(its torch import is on this run's start)")
        return own
    try:
        return SharedTemplate(address)
    except TemplateError as exc:
        return _own_instead(address, str(exc))


def _own_instead(address: str | None, why: str) -> Template:
    own = Template()
    own.notice = f"the shared rank template at {address} cannot be used ({why}): this process started its own"
    return own


def prewarm() -> None:
    """Start this process's template now, in the background: the CLI calls it before its own torch import."""
    local_template(wait=False)


if __name__ == "__main__":
    from workbench.supervisor.template_server import main

    main()
