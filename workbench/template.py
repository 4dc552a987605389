"""The rank template (a "zygote"): one process that imported torch and the rank code once and forks rank
processes on request, so a rank starts in milliseconds instead of paying torch's import (~1.1 s alone, ~5 s
for 4-5 ranks at once on 2 cores).

Protocol: JSON lines over the template's stdin (owner -> template) and stdout (template -> owner), which its
owner holds as pipes — for this machine, or through a host's launch line (``ssh HOST``, ``ip netns exec NS``):

  owner -> template  ``fork {token, argv, env, cwd, path, log, title}``  fork a rank running
                     ``workbench.rank.main.main(argv)`` in ``cwd`` with ``env`` and ``sys.path = path``, its output
                     appended to ``log`` (None: to /dev/null), its command line set to ``title``
                     ``kill {pid}``  SIGKILL that rank's session (owners on other hosts cannot signal it)
  template -> owner  ``ready {pid}`` once its imports are done
                     ``forked {token, pid}`` or ``fork_failed {token, message}``
                     ``exit {pid, code}`` a forked rank ended (``code`` as ``Popen.returncode``: -N for signal N)

What it guarantees. It imports torch, torch.distributed, numpy, h5py and the rank modules, runs no torch op and
starts no thread, so each fork is a copy-on-write copy of a single-threaded process. It never imports the
user's model or dataset code: the forked rank does that itself, so a template outlives the user's edits.

No orphans. A forked rank starts a session of its own (a fault or a kill reaches its process group), asks for
SIGKILL when the template dies (``PR_SET_PDEATHSIG``, checked against the race with the template's death), and,
like every rank, exits when its control channel to the supervisor closes. When the template's stdin ends — its
owner died or let it go — it SIGKILLs every rank it forked and exits. The owner starts the template from a
thread that lives as long as the owner's process (the parent-death signal follows the thread that started a
process), and with a parent-death signal of its own: a killed notebook kernel takes its template along.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from workbench.processes import RANK_ENV_DEFAULTS, THREAD_ENV, child_env, die_with_parent, import_path, kill_session
from workbench.protocol import LineDecoder, encode

# not torch._dynamo (~1.6 s, more than torch itself): ranks step with workbench.rank.optim, which never imports it
PRELOAD = ("torch", "torch.distributed", "torch.nn.functional", "numpy", "h5py",
           "workbench.rank.main", "workbench.rank.gossip", "workbench.rank.pipeline")


# -- the template process ------------------------------------------------------------------------------------------
class _Server:
    def __init__(self) -> None:
        # the protocol's pipes get private descriptors; fds 0/1 become /dev/null and stderr, so nothing a
        # library prints can corrupt the protocol
        self.inp = os.dup(0)
        self.out = os.dup(1)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(2, 1)
        os.close(devnull)
        self.children: set[int] = set()
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: self.shutdown(128 + signum))

    def send(self, message: dict[str, Any]) -> None:
        data = encode(message)
        try:
            while data:
                data = data[os.write(self.out, data):]
        except OSError:
            self.shutdown(0)  # the owner is gone

    def serve(self) -> None:
        self.send({"type": "ready", "pid": os.getpid()})
        decoder = LineDecoder()
        while True:
            try:
                ready = select.select([self.inp, self.wake_r], [], [])[0]
            except InterruptedError:
                continue
            if self.wake_r in ready:
                try:
                    os.read(self.wake_r, 4096)
                except BlockingIOError:
                    pass
                self.reap()
            if self.inp in ready:
                data = os.read(self.inp, 65536)
                if not data:
                    self.shutdown(0)
                for message in decoder.feed(data):
                    if message["type"] == "fork":
                        self.fork(message)
                    elif message["type"] == "kill" and message["pid"] in self.children:
                        kill_session(message["pid"])

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.send({"type": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def fork(self, request: dict[str, Any]) -> None:
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:
            self.send({"type": "fork_failed", "token": request["token"], "message": str(exc)})
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
        self.send({"type": "forked", "token": request["token"], "pid": pid})

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

        setproctitle.setproctitle(title)
    except ImportError:
        pass


def main() -> None:
    """``python -m workbench.template``: import, then serve fork requests on stdin until it ends."""
    die_with_parent()
    os.environ[_IN_TEMPLATE] = "1"  # its forks clear it: a rank's environment is the owner's
    server = _Server()
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    # before any rank's environment replaces this one: the title takes that space
    _set_title(f"{sys.executable} -m workbench.template (rank template of pid {os.getppid()})")
    gc.collect()
    gc.freeze()  # imported objects stay out of the forks' collections: fewer copy-on-write page copies
    server.serve()


# -- the owner's side ---------------------------------------------------------------------------------------------
class TemplateError(RuntimeError):
    """The template could not be started or could not fork a rank."""


class ForkedProcess:
    """A rank forked by a template: the part of ``subprocess.Popen`` the supervisor uses (pid, poll, wait, kill)."""

    def __init__(self, template: Template, pid: int) -> None:
        self.template = template
        self.pid = pid
        self.returncode: int | None = None
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
        self.template.request({"type": "kill", "pid": self.pid})

    def _end(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._ended.set()


class Template:
    """The owner's handle on one template process: ``fork()`` a rank, learn its exit code.

    ``prefix``: a host's launch line (empty: this machine). The template is started, and its output read, by a
    thread of its own that lives until the template ends, so its parent-death signal fires only with this process."""

    def __init__(self, prefix: Sequence[str] = (), stderr: Any = None, ready_timeout: float = 120.0) -> None:
        self.prefix = list(prefix)
        self.remote = bool(prefix)
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None
        self.alive = True
        self.reason = ""
        self._stderr = stderr
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._waiting: dict[int, dict[str, Any]] = {}  # token -> reply
        self._replied = threading.Condition(self._lock)
        self._children: dict[int, ForkedProcess] = {}
        self._token = 0
        self._started = threading.Event()
        self._ready_timeout = ready_timeout
        threading.Thread(target=self._own, name="workbench-template", daemon=True).start()
        self._started.wait()

    # the owner thread: start, then read until the template ends
    def _own(self) -> None:
        env = child_env(THREAD_ENV)
        try:
            self.proc = subprocess.Popen([*self.prefix, sys.executable, "-m", "workbench.template"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
                                         start_new_session=True, bufsize=0)
        except OSError as exc:
            self._fail(f"cannot start the rank template ({exc.strerror})")
            self._started.set()
            return
        self._started.set()
        decoder = LineDecoder()
        try:
            while True:
                try:
                    data = os.read(self.proc.stdout.fileno(), 65536)  # type: ignore[union-attr]
                except (OSError, ValueError):
                    data = b""
                if not data:
                    break
                for message in decoder.feed(data):
                    self._on_message(message)
        finally:
            kill_session(self.proc.pid)  # a template that stopped talking is of no use: make sure it is gone
            code = self.proc.wait()
            self._fail(f"the rank template was killed ({signal.Signals(-code).name})" if code < 0
                       else f"the rank template exited with code {code}")

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "ready":
            self.pid = message["pid"]
            self._ready.set()
        elif kind in ("forked", "fork_failed"):
            with self._lock:
                self._waiting[message["token"]] = message
                if kind == "forked":
                    self._children[message["pid"]] = ForkedProcess(self, message["pid"])
                self._replied.notify_all()
        elif kind == "exit":
            with self._lock:
                child = self._children.pop(message["pid"], None)
            if child is not None:
                child._end(message["code"])

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
            if not self.alive or self.proc is None:
                return
            try:
                self.proc.stdin.write(encode(message))  # type: ignore[union-attr]
            except (OSError, ValueError):
                pass  # its end is noticed by the owner thread

    def fork(self, argv: list[str], log: str | None, title: str, env: dict[str, str] | None = None,
             timeout: float = 30.0) -> ForkedProcess:
        """Fork a rank running ``workbench.rank.main.main(argv)``; raises TemplateError when it cannot."""
        deadline = time.monotonic() + timeout
        if not self._ready.wait(max(0.0, self._ready_timeout)):
            raise TemplateError(f"the rank template was not ready within {self._ready_timeout:g} s")
        with self._lock:
            self._token += 1
            token = self._token
        self.request({"type": "fork", "token": token, "argv": argv, "log": log, "title": title,
                      "env": {**RANK_ENV_DEFAULTS, **os.environ, **THREAD_ENV, **(env or {})}, "cwd": os.getcwd(),
                      "path": import_path()})
        with self._lock:
            while token not in self._waiting:
                if not self.alive:
                    raise TemplateError(self.reason)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TemplateError(f"the rank template did not fork within {timeout:g} s")
                self._replied.wait(remaining)
            reply = self._waiting.pop(token)
            if reply["type"] == "fork_failed":
                raise TemplateError(f"the rank template could not fork: {reply['message']}")
            return self._children.get(reply["pid"]) or _ended(self, reply["pid"])

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


def _ended(template: Template, pid: int) -> ForkedProcess:
    """A rank that ended before its fork was acknowledged (its exit message came first)."""
    child = ForkedProcess(template, pid)
    child._end(-signal.SIGKILL)
    return child


_IN_TEMPLATE = "WORKBENCH_IN_TEMPLATE"
_local: Template | None = None
_local_lock = threading.Lock()


def local_template() -> Template:
    """This process's template for ranks on this machine: started on first use, reused by every later run
    (a notebook kernel, a sweep worker, a benchmark), started anew if it died."""
    global _local
    if os.environ.get(_IN_TEMPLATE):
        # a template never starts one: something its imports ran (e.g. a script named like a module torch imports,
        # `numbers.py`, on the path) would otherwise start templates without end
        raise TemplateError("a rank template may not start a run: one of its imports started one (is a file of "
                            f"yours shadowing a module torch imports? sys.path: {sys.path[:3]})")
    with _local_lock:
        if _local is None or not _local.alive:
            _local = Template()
        return _local


def prewarm() -> None:
    """Start this process's template now, in the background: the CLI calls it before its own torch import."""
    local_template()


if __name__ == "__main__":
    main()
