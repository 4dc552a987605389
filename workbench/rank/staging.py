"""A checkpoint's snapshot copied off the training loop's critical path, as torch's asynchronous distributed
checkpoint (``async_save``) stages its state: the training thread hands the writer thread its *live* tensors,
grouped into parts in the order the next step modifies them (a data-parallel replica: one part per gradient
bucket, the order its updates are applied in); the writer copies them part by part into staging buffers it keeps
from one checkpoint to the next (no page faults after the first), then writes HDF5 from the copies. Whatever
modifies the state in place first (a bucket's optimizer update, a recovery that restores or receives state, a flip
into the weights) calls :meth:`Staged.wait` for what it is about to modify, so the snapshot is exactly the state of
the checkpoint's step, and the training loop waits only where it overtakes the copy: that wait, with the
references taken on the training thread, is the checkpoint's ``stall_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, MutableMapping

import torch

from workbench.rank.optim import Optimizer

# where the writer puts a live tensor's copy: (address in the staging cache, the dict holding it, its key there)
Slot = tuple[str, MutableMapping, str]
_LIVENESS_SLICE = 0.5  # a waiting training thread looks this often whether the writer is still alive
# a state this small is copied on the training thread at once: ~0.2 ms at most, less than handing it to another
# thread costs on a busy host (that thread waits for a core and the interpreter lock while the step goes on)
INLINE_BYTES = 1 << 20
_IDLE_S = 60.0  # a writer thread with nothing to do for this long ends (the next checkpoint starts another)


class Staged:
    """Live tensors of one checkpoint, in ``parts`` (each a list of slots), copied in order by :meth:`copy` on the
    writer thread; :meth:`wait` (training thread) returns once a part and every part before it are copied."""

    def __init__(self, parts: list[list[Slot]]) -> None:
        self.parts = parts
        self._copied = [threading.Event() for _ in parts]
        self._lock = threading.Condition()
        self.waiting_for: int | None = None  # the part the training thread waits for (None: it does not wait)
        self.waited_s = 0.0  # how long the training thread has waited for the copy, all its waits together
        self.copy_s = 0.0
        self.writer: Writer | None = None  # what copies (a wait ends if it stops with the copy unfinished)

    @property
    def done(self) -> bool:
        return not self._copied or self._copied[-1].is_set()

    @property
    def nbytes(self) -> int:
        return sum(holder[key].nbytes for part in self.parts for _, holder, key in part)

    def copy(self, cache: dict[str, torch.Tensor]) -> None:
        """Writer thread: replace every slot's live tensor by its copy, part after part, into ``cache``'s buffers
        (reused where shape and dtype still fit); every part is marked copied even if a copy fails, so no
        training thread is left waiting."""
        began = time.perf_counter()
        try:
            for index, copied in enumerate(self._copied):
                self._copy_part(index, cache)
                with self._lock:  # a wait that starts after this sees it; one that started before is counted
                    copied.set()
        finally:
            self.copy_s = time.perf_counter() - began
            with self._lock:
                for copied in self._copied:
                    copied.set()

    def _copy_part(self, index: int, cache: dict[str, torch.Tensor]) -> None:
        for address, holder, key in self.parts[index]:
            live = holder[key]
            spare = cache.get(address)
            if spare is None or spare.shape != live.shape or spare.dtype != live.dtype \
                    or spare.stride() != live.stride():
                spare = cache[address] = _host_like(live)
            holder[key] = spare.copy_(live)  # from a GPU: synchronous, into pinned memory

    def wait(self, part: int | None = None) -> None:
        """Training thread, before it modifies the state in place: return once ``part`` (None: the last one) and
        the parts before it are copied. Bounded by the copy itself (the writer marks every part when it ends)."""
        if not self._copied:
            return
        index = len(self._copied) - 1 if part is None else min(part, len(self._copied) - 1)
        copied = self._copied[index]
        with self._lock:
            if copied.is_set():
                return
            self.waiting_for = index
            self._lock.notify_all()
        began = time.perf_counter()
        try:
            while not copied.wait(_LIVENESS_SLICE):
                if self.writer is not None and not self.writer.is_alive():
                    raise RuntimeError("the checkpoint writer ended before it had copied the snapshot")
        finally:
            with self._lock:
                self.waited_s += time.perf_counter() - began
                self.waiting_for = None
                self._lock.notify_all()

    def waited(self, timeout: float = 60.0) -> float:
        """Writer thread, after the copy: the training thread's waits, once one under way has been counted (it
        ends as soon as the training thread wakes up: every part is copied by then)."""
        with self._lock:
            self._lock.wait_for(lambda: self.waiting_for is None, timeout)
            return self.waited_s


class Writer:
    """The rank's checkpoint writer: one thread that runs the jobs handed to it, one at a time. Handing a job over
    does not wait for a thread to start (``Thread.start`` returns only once the new thread runs, a scheduling
    delay of the training loop on a busy host); the thread ends after ``_IDLE_S`` without work. A job that raises
    is handed to ``on_error``."""

    def __init__(self, on_error: Callable[[Exception], None]) -> None:
        self._lock = threading.Condition()
        self._job: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None
        self._on_error = on_error  # a job that raised: called on the writer thread (a rank ends its run)

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the writer thread; the previous job must be done (``join``)."""
        with self._lock:
            if self._job is not None:
                raise RuntimeError("a checkpoint job is still under way")
            self._job = job
            self._lock.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="wb-checkpoint", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            with self._lock:
                if not self._lock.wait_for(lambda: self._job is not None, _IDLE_S):
                    self._thread = None
                    return
                job = self._job
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - never lost: a run does not go on without its checkpoint
                self._on_error(exc)
            finally:
                with self._lock:
                    self._job = None
                    self._lock.notify_all()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the job handed over is done (at most ``timeout`` seconds)."""
        with self._lock:
            self._lock.wait_for(lambda: self._job is None, timeout)

    def is_alive(self) -> bool:
        """A job is under way (or waits for the thread)."""
        with self._lock:
            return self._job is not None


def stage_replica(model: torch.nn.Module, groups: list[tuple[list[str], list[torch.nn.Parameter], Optimizer]]
                  ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]], Staged]:
    """A replica's checkpoint state as live references, cheap to take: (model state dict, optimizer state per
    parameter name in the layout of :func:`.state.named_optimizer_state`, the :class:`Staged` that copies them),
    one part per group of parameters (name, parameter, its optimizer), in the order their updates come. What no
    group holds (batch norm's statistics, which the next forward moves; a frozen parameter) is cloned now."""
    model_state = model.state_dict()  # detached tensors sharing the live storage
    optimizer_state: dict[str, dict[str, torch.Tensor]] = {}
    parts: list[list[Slot]] = []
    staged_names: set[str] = set()
    for names, params, optimizer in groups:
        part: list[Slot] = []
        for name, param in zip(names, params):
            if name in model_state:
                part.append((f"model/{name}", model_state, name))
                staged_names.add(name)
            state = optimizer.state.get(param, {})
            optimizer_state[name] = {k: (v.detach() if torch.is_tensor(v) else torch.tensor(v))
                                     for k, v in state.items() if v is not None}
            part += [(f"optim/{name}/{k}", optimizer_state[name], k) for k, v in state.items() if torch.is_tensor(v)]
        parts.append(part)
    for name in model_state:
        if name not in staged_names:
            model_state[name] = model_state[name].detach().clone()
    return model_state, optimizer_state, Staged(parts)


def _host_like(live: torch.Tensor) -> torch.Tensor:
    """An uninitialised host tensor laid out like ``live``: pinned for a GPU tensor (the copy goes at full speed)."""
    if live.device.type == "cpu":
        return torch.empty_like(live)
    return torch.empty_strided(live.size(), live.stride(), dtype=live.dtype, device="cpu", pin_memory=True)
