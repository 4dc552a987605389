"""The rank template's own process (``python -m workbench.supervisor.template [--listen-fd N]``): it imports torch and
the rank code once, then forks ranks for its owner, over its stdin and stdout, and — given a listening Unix socket N (a
sweep worker's shared template, :func:`workbench.supervisor.template.share`) — for every process of the same user that
connects to that socket. Protocol, guarantees and the owner's side: :mod:`workbench.supervisor.template`.

Each rank belongs to whoever asked for it: its ``exit`` goes to that owner, only that owner may ``kill`` it, and
when a connection ends (the notebook kernel that connected died or let go) the ranks it asked for are SIGKILLed.
When the owner's stdin ends, every rank is SIGKILLed and the template exits.
"""

from __future__ import annotations

import gc
import hashlib
import os
import select
import signal
import socket
import struct
import sys
from typing import Any

from workbench.base.processes import die_with_parent, kill_session
from workbench.base.protocol import OWNER, TEMPLATE, LineDecoder, ProtocolError, encode

# not torch._dynamo (~1.6 s, more than torch itself): ranks step with workbench.rank.optim, which never imports it
PRELOAD = ("torch", "torch.distributed", "torch.nn.functional", "numpy", "h5py",
           "workbench.rank.main", "workbench.rank.gossip", "workbench.rank.pipeline")
IN_TEMPLATE = "WORKBENCH_IN_TEMPLATE"
SEND_TIMEOUT_S = 10.0  # a connected process that reads nothing for this long is dropped, its ranks killed


def identity() -> dict[str, str]:
    """What a process sharing a template must have in common with it: the same Python and the same workbench, its
    files unchanged since the template read them (the template's imported code is what its ranks run)."""
    return {"prefix": sys.prefix, "executable": os.path.realpath(sys.executable),
            "workbench": os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "code": code_fingerprint()}


def code_fingerprint() -> str:
    """A hash of the path, size and modification time of every ``.py`` file of the workbench package (~1 ms)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha1()
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            try:
                info = os.stat(os.path.join(directory, name))
            except OSError:
                continue
            digest.update(f"{directory}/{name}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


class _Client:
    """A process connected to the shared socket, and the ranks it asked for."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.decoder = LineDecoder()
        self.children: set[int] = set()
        self.closed = False


class Server:
    def __init__(self, listen_fd: int | None = None) -> None:
        # the protocol's pipes get private descriptors; fds 0/1 become /dev/null and stderr, so nothing a
        # library prints can corrupt the protocol
        self.inp = os.dup(0)
        self.out = os.dup(1)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(2, 1)
        os.close(devnull)
        self.children: set[int] = set()
        self.owners: dict[int, _Client | None] = {}  # rank pid -> the connection that asked for it (None: stdin)
        self.clients: dict[int, _Client] = {}  # socket fd -> connection
        self.listener = socket.socket(fileno=listen_fd) if listen_fd is not None else None
        self.reaped_cpu_s = 0.0  # CPU seconds of the ranks reaped so far (and of what they reaped)
        self.identity = identity()  # before the imports: a file changed while they ran counts as changed
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: self.shutdown(128 + signum))

    def send(self, message: dict[str, Any], client: _Client | None = None) -> None:
        data = encode(message)
        if client is not None:
            if not client.closed:
                try:
                    client.sock.sendall(data)
                except OSError:  # gone, or reads nothing for SEND_TIMEOUT_S
                    self.drop(client)
            return
        try:
            while data:
                data = data[os.write(self.out, data):]
        except OSError:
            self.shutdown(0)  # the owner is gone

    def serve(self) -> None:
        self.send(TEMPLATE.message("ready", pid=os.getpid()))
        decoder = LineDecoder()
        while True:
            watched = [self.inp, self.wake_r, *self.clients]
            if self.listener is not None:
                watched.append(self.listener.fileno())
            try:
                ready = select.select(watched, [], [])[0]
            except InterruptedError:
                continue
            if self.wake_r in ready:
                try:
                    os.read(self.wake_r, 4096)
                except BlockingIOError:
                    pass
                self.reap()
            for fd in ready:
                if fd in self.clients:
                    self.receive(self.clients[fd])
            if self.listener is not None and self.listener.fileno() in ready:  # after: a new one may reuse an fd
                self.accept()
            if self.inp in ready:
                data = os.read(self.inp, 65536)
                if not data:
                    self.shutdown(0)
                for message in decoder.feed(data):
                    self.handle(message, None)

    def handle(self, message: dict[str, Any], client: _Client | None) -> None:
        kind = TEMPLATE.received(message, OWNER)
        if kind == "fork":
            self.fork(message, client)
        elif kind == "kill" and message["pid"] in self.children and self.owners.get(message["pid"]) is client:
            kill_session(message["pid"])
        elif kind == "usage" and client is None:
            self.send(TEMPLATE.message("usage_answer", token=message["token"], cpu_s=self.reaped_cpu_s))

    # -- the shared socket -----------------------------------------------------------------------------------------
    def accept(self) -> None:
        try:
            sock, _ = self.listener.accept()  # type: ignore[union-attr]
        except OSError:
            return
        try:
            _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                            struct.calcsize("3i")))
        except OSError:
            uid = -1
        if uid != os.getuid():  # a rank runs whatever its sys.path holds: only this user may ask for one
            sock.close()
            return
        sock.settimeout(SEND_TIMEOUT_S)
        client = _Client(sock)
        self.clients[client.fd] = client
        self.send(TEMPLATE.message("ready", pid=os.getpid(), **self.identity), client)

    def receive(self, client: _Client) -> None:
        try:
            data = client.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self.drop(client)
            return
        try:
            for message in client.decoder.feed(data):
                self.handle(message, client)
        except (ValueError, KeyError, TypeError, ProtocolError):  # not the protocol: that connection goes, nothing else
            self.drop(client)

    def drop(self, client: _Client) -> None:
        """A connection ended: SIGKILL the ranks it asked for (their exits are reaped as usual)."""
        if client.closed:
            return
        client.closed = True
        self.clients.pop(client.fd, None)
        for pid in list(client.children):
            kill_session(pid)
        client.sock.close()

    # -- ranks -----------------------------------------------------------------------------------------------------
    def reap(self) -> None:
        while self.children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.reaped_cpu_s += usage.ru_utime + usage.ru_stime
            self.children.discard(pid)
            owner = self.owners.pop(pid, None)
            if owner is not None:
                owner.children.discard(pid)
            self.send(TEMPLATE.message("exit", pid=pid, code=os.waitstatus_to_exitcode(status),
                                       cpu_s=usage.ru_utime + usage.ru_stime), owner)

    def fork(self, request: dict[str, Any], client: _Client | None) -> None:
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:
            self.send(TEMPLATE.message("fork_failed", token=request["token"], message=str(exc)), client)
            return
        if pid == 0:
            code = 1
            try:
                self._become_rank(request, parent)
            except BaseException:  # noqa: BLE001 - a rank that cannot start says why in its log, then ends
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        self.children.add(pid)
        self.owners[pid] = client
        if client is not None:
            client.children.add(pid)
        self.send(TEMPLATE.message("forked", token=request["token"], pid=pid), client)

    def _become_rank(self, request: dict[str, Any], parent: int) -> None:
        os.setsid()
        die_with_parent()
        if os.getppid() != parent:  # the template died before the death signal was armed
            os._exit(1)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        for fd in (self.inp, self.out, self.wake_r, self.wake_w):
            os.close(fd)
        # no rank holds the template's sockets: a connection ends with its process, the socket with the template
        for sock in [c.sock for c in self.clients.values()] + ([self.listener] if self.listener else []):
            os.close(sock.detach())
        os.chdir(request["cwd"])  # first: a relative log path is the owner's
        log = request.get("log")
        target = os.open(log or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, 1)
        os.dup2(target, 2)
        os.close(target)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["path"]
        sys.argv = ["workbench.rank", *request["argv"]]
        _set_title(request.get("title") or "workbench.rank")
        gc.unfreeze()
        from workbench.rank.main import main

        main(request["argv"])  # ends the process with os._exit

    def shutdown(self, code: int) -> None:
        for pid in list(self.children):
            kill_session(pid)
        os._exit(code)


def _set_title(title: str) -> None:
    try:
        import setproctitle
    except ImportError:  # a GPU host's bare environment (tests/test_devices.py): the rank keeps the template's title
        return  # no speed or accuracy is traded; only `ps` and the leak checks see the title (docs/concepts.md)
    setproctitle.setproctitle(title)


def main(argv: list[str] | None = None) -> None:
    """Import, then serve fork requests on stdin (and on the socket of ``--listen-fd N``) until stdin ends."""
    from workbench.base.entry import OneLineParser, open_fd

    parser = OneLineParser(prog="python -m workbench.supervisor.template", description="A rank template process.")
    parser.add_argument("--listen-fd", type=open_fd, metavar="N", help="a listening socket it serves too")
    listen_fd = parser.parse_args(argv).listen_fd
    die_with_parent()
    os.environ[IN_TEMPLATE] = "1"  # its forks clear it: a rank's environment is its owner's
    server = Server(listen_fd)  # the socket listens from the start: a process connecting now waits for "ready"
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    # before any rank's environment replaces this one: the title takes that space
    shared = ", shared" if listen_fd is not None else ""
    _set_title(f"{sys.executable} -m workbench.supervisor.template (rank template of pid {os.getppid()}{shared})")
    gc.collect()
    gc.freeze()  # imported objects stay out of the forks' collections: fewer copy-on-write page copies
    server.serve()
