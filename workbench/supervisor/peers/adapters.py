"""The supervisor's adapter per peer strategy: what it starts beside the ranks, how its workers join, and how its
own messages become our figures (:mod:`.supervision` holds the pieces). Looked up once per run by
:func:`adapter`; the supervisor asks it instead of comparing names.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from workbench.base.protocol import Message
from workbench.config.run import RunConfig
from workbench.strategies import PeerRuntime, Strategy
from workbench.supervisor.launcher import Launcher
from workbench.supervisor.peers import supervision as sv
from workbench.supervisor.recorder import Recorder

Handler = Callable[[Recorder, int, "int | None", Message], None]


class PeerAdapter:
    """A peer with nothing of its own beside the ranks; subclasses add their services and messages."""

    one_reporter = False  # only the lowest member's step figures are recorded (every replica reports them)
    handlers: dict[str, Handler] = {}  # message kinds of its own -> handler(recorder, spawn_id, label, message)

    def __init__(self, strategy: Strategy) -> None:
        assert strategy.peer is not None
        self.name: str = strategy.name
        self.runtime: PeerRuntime = strategy.peer

    @property
    def agent(self) -> bool:
        """Its own launcher starts the ranks; they join slots of ours."""
        return self.runtime.agent

    def start_service(self, launcher: Launcher, host: str, heartbeat_timeout: float) -> str | None:
        """Start what runs beside the ranks (torchft's lighthouse); its address."""
        return None

    def start_agent(self, launcher: Launcher, config: RunConfig, store_address: str, planned: int,
                    recorder: Recorder) -> subprocess.Popen | None:
        return None

    def slot_joined(self, recorder: Recorder) -> None:
        """A worker started by the agent said hello."""

    def step(self, recorder: Recorder, spawn_id: int, label: int | None, reporter: bool, m: Message) -> None:
        """A worker committed a step."""

    def agent_ended(self, code: int, started: bool, log_hint: Callable[[str], str]) -> tuple[str, str]:
        when = "during start-up" if not started else "before every surviving rank finished"
        return "failed", f"{self.name}'s launcher exited {when} (code {code})"


class Torchft(PeerAdapter):
    one_reporter = True
    handlers = {
        "quorum": sv.torchft_quorum,
        "discarded": lambda recorder, spawn_id, label, m: sv.torchft_discarded(recorder, label, m),
    }

    def start_service(self, launcher: Launcher, host: str, heartbeat_timeout: float) -> str | None:
        return sv.start_lighthouse(launcher, host, heartbeat_timeout)

    def step(self, recorder: Recorder, spawn_id: int, label: int | None, reporter: bool, m: Message) -> None:
        sv.torchft_step(recorder, spawn_id, label, reporter, m)


class Torchrun(PeerAdapter):
    def start_agent(self, launcher: Launcher, config: RunConfig, store_address: str, planned: int,
                    recorder: Recorder) -> subprocess.Popen | None:
        return sv.start_torchrun(launcher, config, store_address, planned, recorder)

    def slot_joined(self, recorder: Recorder) -> None:
        sv.torchrun_restarted(recorder)  # a restarted worker: the agent has seen the failure

    def agent_ended(self, code: int, started: bool, log_hint: Callable[[str], str]) -> tuple[str, str]:
        return sv.torchrun_ended(code, started, log_hint)


class Ulfm(PeerAdapter):
    handlers = {"ulfm": lambda recorder, spawn_id, label, m: sv.ulfm_message(recorder, label, m)}

    def start_agent(self, launcher: Launcher, config: RunConfig, store_address: str, planned: int,
                    recorder: Recorder) -> subprocess.Popen | None:
        return sv.start_mpirun(launcher, config, store_address, recorder)

    def step(self, recorder: Recorder, spawn_id: int, label: int | None, reporter: bool, m: Message) -> None:
        recorder.peer_step(m)  # every survivor's steps: what was committed before the shrink, what is redone after

    def agent_ended(self, code: int, started: bool, log_hint: Callable[[str], str]) -> tuple[str, str]:
        return sv.mpirun_ended(code, started, log_hint)


ADAPTERS: dict[str, type[PeerAdapter]] = {"torchft": Torchft, "torchrun": Torchrun, "ulfm": Ulfm}


def adapter(strategy: Strategy) -> PeerAdapter | None:
    """The adapter of a peer strategy (None for ours)."""
    if strategy.peer is None:
        return None
    return ADAPTERS.get(strategy.name, PeerAdapter)(strategy)
