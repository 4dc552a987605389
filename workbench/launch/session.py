"""Starting runs: ``start(config) -> Run`` (a live handle) and ``run(config) -> RunResult`` (blocking).

A :class:`Run` owns one monitor thread that runs the :class:`~workbench.supervisor.core.Supervisor`; the rank
processes are children of that thread. ``kill``, ``hang`` and ``stop`` may be called from any thread (widgets
do). Interrupting ``wait()`` (Ctrl-C, a notebook's interrupt button) stops the run before re-raising, and an
``atexit`` hook stops every run still going when the interpreter exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.base.h5files import OutputError
from workbench.config.preflight import prepare
from workbench.config.run import RunConfig
from workbench.results import summary as summaries
from workbench.results.outdir import Claim, claim, remove_temporaries
from workbench.results.run_result import RunResult
from workbench.supervisor.core import Supervisor

if TYPE_CHECKING:  # the sweep layer is imported only for a run given its sweep point (start's ``point``)
    from workbench.launch.sweeps.requeue import PointRun

_live_runs: weakref.WeakSet[Run] = weakref.WeakSet()

Listener = Callable[[str, dict[str, Any]], None]


class Run:
    """A run going on in the background. ``events`` and ``metrics`` fill up live; ``wait()`` gives the result."""

    def __init__(self, config: RunConfig, out: str | Path | Claim | None = None,
                 on_event: Listener | None = None, track: str | None = None, point: PointRun | None = None) -> None:
        self.config = config
        # a Claim (workbench.results.outdir.claim): the directory is this run's until its result is saved, then let go
        self._claim = out if isinstance(out, Claim) else None
        self.out = out.path if isinstance(out, Claim) else Path(out) if out is not None else None
        self.track = track  # an MLflow tracking URI (workbench.results.tracking.require): logged after the run ends
        self._listeners: list[Listener] = [on_event] if on_event else []
        self._failed: list[Listener] = []  # listeners that raised: said once each (_dispatch)
        self._supervisor = Supervisor(config, self.out, on_event=self._dispatch)
        # in a sweep point (workbench.launch.sweeps.requeue): the earlier attempt's record, where the job stops
        # on notice
        self._point, self._earlier = point, point.earlier() if point is not None and config.resume else None
        self._supervisor.keep_stopped = point.keep if point is not None else None
        self._noticed = False
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"workbench-run-{uuid.uuid4().hex[:6]}", daemon=True)
        if self._claim is not None:  # nothing can refuse the start any more: an overwritten run's files go now
            self._claim.clear()
        _live_runs.add(self)
        self._thread.start()

    # -- live view -------------------------------------------------------------------------------------------
    @property
    def metrics(self) -> list[dict[str, Any]]:
        return self._supervisor.metrics

    @property
    def events(self) -> list[dict[str, Any]]:
        return self._supervisor.events

    @property
    def status(self) -> dict[str, Any]:
        return dict(self._supervisor.status)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(kind, payload)`` on the monitor thread for each step row (``step``), event (``event``) and
        member's own step time (``rank_step``: step, generation, rank, cpu_s, slow) from now on."""
        self._listeners.append(listener)

    # -- control -----------------------------------------------------------------------------------------------
    def kill(self, rank: int) -> None:
        """SIGKILL ``rank`` now (a permanent fault). ConfigError for a wrong type, a rank the run does not have,
        a dead rank or an ended run (:mod:`workbench.launch.live_ranks`)."""
        from workbench.launch.live_ranks import live_rank

        self._supervisor.command("kill", live_rank(rank, "kill", self.status, self.events, self.config.world_size,
                                                   self.done))

    def hang(self, rank: int) -> None:
        """SIGSTOP ``rank`` now (it freezes; heartbeats find it). ConfigError as for :meth:`kill`."""
        from workbench.launch.live_ranks import live_rank

        self._supervisor.command("hang", live_rank(rank, "hang", self.status, self.events, self.config.world_size,
                                                   self.done))

    def stall(self, rank: int) -> None:
        """Block ``rank``'s training thread at its next step while its heartbeat goes on (a deadlock, a stuck
        loop): the progress watchdog finds it. ConfigError as for :meth:`kill`."""
        from workbench.launch.live_ranks import live_rank

        self._supervisor.command("stall", live_rank(rank, "stall", self.status, self.events, self.config.world_size,
                                                    self.done))

    def slow(self, rank: int, factor: float = 3.0, seconds: float | None = None) -> None:
        """Make ``rank``'s steps ``factor`` times as long from its next step (1: full speed again), for ``seconds``
        (None: until changed): it burns CPU in proportion to its own compute. ConfigError as for :meth:`kill`."""
        from workbench.faults.slow import check_live_slow
        from workbench.launch.live_ranks import live_rank

        factor, seconds = check_live_slow(factor, seconds)
        self._supervisor.command("slow", (live_rank(rank, "slow down", self.status, self.events,
                                                    self.config.world_size, self.done), factor, seconds))

    def flip(self, rank: int, target: str, tensor: str, index: int | None = None, bit: int | None = None,
             seed: int | None = None) -> None:
        """Flip a bit on ``rank`` at its next step (index/bit drawn from ``seed`` when left out)."""
        from workbench.config.run import FaultSpec
        from workbench.faults.targets import check_flip_targets
        from workbench.launch.live_ranks import live_rank

        rank = live_rank(rank, "flip a bit on", self.status, self.events, self.config.world_size, self.done)
        fault = FaultSpec("flip", rank, step=-1, target=target, tensor=tensor, index=index, bit=bit, seed=seed)
        check_flip_targets(self.config.replace(faults=[]), [fault])
        self._supervisor.command("flip", fault)

    def preempt(self, rank: int, grace: float | None = None) -> None:
        """Give ``rank`` notice of a preemption: ``grace`` seconds (default ``preempt_grace``) to leave at a step
        boundary; what the strategy then does: docs/permanent-faults.md. ConfigError as for :meth:`kill`."""
        from workbench import strategies
        from workbench.base.errors import ConfigError
        from workbench.faults.spec import FaultSpec
        from workbench.launch.live_ranks import live_rank

        if strategies.get(self.config.strategy).peer is not None:
            raise ConfigError("strategy", f"{self.config.strategy!r} runs the peer system as its users do: it has no "
                              "notice path (kill the rank instead)")
        rank = live_rank(rank, "preempt", self.status, self.events, self.config.world_size, self.done)
        self._supervisor.command("preempt", FaultSpec("preempt", rank, time=0.0, grace=self._grace(grace)))

    def _grace(self, grace: float | None) -> float:
        """``grace`` (default ``preempt_grace``), or a ConfigError saying what is allowed."""
        from workbench.base.errors import ConfigError

        grace = self.config.preempt_grace if grace is None else grace
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace < float("inf"):
            raise ConfigError("grace", f"{grace!r} is not allowed: a number of seconds >= 0")
        return float(grace)

    def resize(self, world: int) -> None:
        """Change the world to ``world`` ranks at the next step boundary (data parallel, gossip, hybrid): newcomers
        are forked and get the state, or the newest ranks leave; the learning rate follows ``resize_rule``.
        ConfigError for a size the run cannot take."""
        from workbench.base.errors import ConfigError
        from workbench.config.resizing import check_world

        check_world(self.config, world, f"resize to {world!r}")
        if self.config.resize_rule == "linear":  # its global batch must fit the training set
            from workbench.config import resize_rule
            from workbench.config.preflight import dataset_info

            n_train = dataset_info(self.config.dataset, self.config.synthetic_size).n_train
            resize_rule.check_sizes(self.config, n_train, [world])
        if self.done:
            raise ConfigError("resize", "the run has ended")
        self._supervisor.command("resize", world)

    def stop(self, reason: str = "stopped by the user") -> None:
        self._supervisor.command("stop", reason)

    def finish(self) -> None:
        """End the run cleanly at the next step boundary, a few steps past the furthest one committed: every rank
        completes that step and reports done, and the run completes with fewer steps (its replicas compared:
        ``replicas_identical``), where :meth:`stop` ends it at once. Every strategy; docs/permanent-faults.md.
        ConfigError once the run has ended."""
        from workbench.base.errors import ConfigError

        if self.done:
            raise ConfigError("finish", "the run has ended")
        self._supervisor.command("finish")

    def notice(self, grace: float | None = None) -> None:
        """Give the whole job notice of preemption: every rank stops at one step boundary, whose checkpoint the
        run's reason names (``resume=PATH`` goes on from it); ``grace`` seconds (default ``preempt_grace``). What
        the run's process does on a signal of ``notice_signals`` while :meth:`wait` blocks in the main thread."""
        grace = self._grace(grace)
        self._noticed = True
        self._supervisor.command("notice", grace)

    def wait(self, timeout: float | None = None) -> RunResult:
        """Block until the run ends and return its result. Ctrl-C stops the run, then re-raises; a signal of
        ``notice_signals`` (in the main thread) or a sweep point's notice is :meth:`notice`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            with self._notice_signals():
                while not self._done.wait(0.1):
                    if self._point is not None and not self._noticed and self._point.noticed():
                        self.notice()
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(f"run still going after {timeout:g} s")
        except KeyboardInterrupt as exc:
            self.stop(interrupt_reason(exc))
            self._done.wait(30)
            raise
        if self._result is None:  # the monitor thread raised (a supervisor's bug: it ends every run in a result)
            raise self._error or RuntimeError("the run ended without a result")
        return self._result

    @property
    def result(self) -> RunResult | None:
        return self._result

    # -- internals ---------------------------------------------------------------------------------------------
    def _dispatch(self, kind: str, payload: dict[str, Any]) -> None:
        """Every listener hears ``kind``; one that raises loses that event (a listener's bug must not kill the
        run), said once per listener: the run's ``fallback`` event ``listener_failed``."""
        for listener in list(self._listeners):
            try:
                listener(kind, payload)
            except Exception as exc:  # noqa: BLE001 - said below, once per listener
                if not any(listener is failed for failed in self._failed):
                    self._failed.append(listener)
                    name = getattr(listener, "__qualname__", None) or repr(listener)
                    why = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"  # one line
                    self._supervisor.recorder.fallback("listener_failed", f"the run's listener {name} raised {why}; "
                                                       "the events it raises on are lost to it (said once)")

    @contextlib.contextmanager
    def _notice_signals(self) -> Iterator[None]:
        """While the main thread waits: the run's ``notice_signals`` give the whole job notice."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = [getattr(signal, name) for name in self.config.notice_signals]
        previous = {sig: signal.signal(sig, lambda signum, frame: self.notice()) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _main(self) -> None:
        try:
            result = self._supervisor.run()
            if self.out is not None:  # every process of the run is gone: a write it did not finish is removed
                remove_temporaries(self.out)
            if self._point is not None:  # kept for the point's next attempt, or continuing the earlier one's
                result = self._point.finish(result, self._earlier, self._noticed)
            if self.out is not None:
                try:
                    result.save(self.out)
                except OutputError as exc:  # a full disk, a read-only place: the result is still returned
                    summaries.not_saved(result.summary, exc)
            if self.track is not None:  # after the ranks are gone; never raises (workbench.results.tracking)
                from workbench.results.tracking import track_result

                track_result(self.track, result, self.out)
            self._result = result
        except BaseException as exc:  # noqa: BLE001 - wait() raises it in the caller's thread
            self._error = exc
        finally:
            if self._claim is not None:
                self._claim.release()
            self._done.set()

    def __repr__(self) -> str:
        return f"Run({self.status})"


def start(config: RunConfig | dict[str, Any] | None = None, out: str | Path | None = None,
          on_event: Listener | None = None, track: str | os.PathLike | None = None, overwrite: bool = False,
          point: str | os.PathLike | None = None, **overrides: Any) -> Run:
    """Validate the configuration (errors before any process starts) and start the run in the background: the one
    door every run goes through (``workbench.run``, ``workbench run``, the Lab panel, a campaign).
    Pipeline and hybrid runs get their ``stage_cuts`` here (measured once, the same for every rank).

    ``out``: the run's directory (``result.h5``, ``checkpoints/``, ``logs/``), this run's alone until it ends: one
    that another live run holds is refused (ConfigError naming that run), and so is one that holds an earlier run's
    files unless ``overwrite``, which removes those files as the run starts (only the run's, and never the checkpoint
    ``resume`` names: :mod:`workbench.results.outdir`; a start refused or failed before leaves them all); one that
    cannot be written, an empty path and a dangling link are refused too.

    ``track``: an MLflow tracking URI (``sqlite:///mlflow.db``) or directory: the run is logged there once it ended
    (:mod:`workbench.results.tracking`; a logging failure is a warning, recorded in ``result.summary["tracking"]``).
    Without MLflow installed it raises ``TrackingUnavailable`` here, before any process starts.

    ``point``: the directory of the sweep point this run belongs to, as the sweep hands it to a notebook that
    declares a ``point`` parameter (:mod:`workbench.launch.sweeps.requeue`): the run then stops on the point's notice of
    preemption, keeping its checkpoint, and the point's next attempt resumes from it. None (the default): a run
    of its own, whatever process it runs in."""
    if track is not None:
        from workbench.results.tracking import require

        track = require(track)
    config = prepare(config, **overrides)  # a configuration prepare() gave back as it is: not checked twice
    place = None
    if point is not None:
        from workbench.launch.sweeps.requeue import PointRun

        place = PointRun.of(config, point)
    kept = place.resume_from() if place is not None else None
    if kept:  # an earlier attempt of this sweep point was preempted here
        config = prepare(config, resume=kept)
    # this run's until it ends (another is refused); the checkpoint it resumes from stays, even in an overwritten out
    held = claim(out, overwrite, keep=config.resume) if out is not None else None
    try:
        run = Run(config, out=held, on_event=on_event, track=track, point=place)
    except BaseException:
        if held is not None:
            held.release()
        raise
    if place is not None and place.noticed():  # the point had notice before this run began: it does not train
        run.notice()
    return run


def run(config: RunConfig | dict[str, Any] | None = None, out: str | Path | None = None,
        on_event: Listener | None = None, track: str | os.PathLike | None = None, overwrite: bool = False,
        point: str | os.PathLike | None = None, **overrides: Any) -> RunResult:
    """Run to the end and return the result (saved to ``out/result.h5`` when ``out`` is given, which must not hold
    an earlier run unless ``overwrite``; logged to MLflow when ``track`` is given; a sweep point's run when
    ``point`` is given; see :func:`start`). A result that cannot be written is still returned, failed, with
    ``summary["result_error"]`` saying why."""
    return start(config, out=out, on_event=on_event, track=track, overwrite=overwrite, point=point,
                 **overrides).wait()


def interrupt_reason(exc: BaseException | None = None) -> str:
    """The reason a run stopped by an interrupt records: ``interrupted``, naming a SIGHUP's hangup."""
    from workbench.base.interrupts import HangUp

    return "interrupted: hangup (SIGHUP: the terminal closed)" if isinstance(exc, HangUp) else "interrupted"


@atexit.register
def stop_all(reason: str = "interpreter exiting", wait: float = 10.0) -> None:
    """Stop every run of this process still going and wait (up to ``wait`` seconds each) until it ended."""
    for live in list(_live_runs):
        if not live.done:
            live.stop(reason)
            live._done.wait(wait)
