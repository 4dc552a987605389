"""The lab panel: an ipywidgets control panel around a live :class:`~workbench.launch.session.Run`.

``Lab()`` shows the run's configuration (the resize rule included), Start / Stop, Kill, Hang, Stall, Preempt and
Slow buttons per rank, a resize box, a slow-factor box, a bit-flip form, a status line, a live plotly
``FigureWidget`` (loss, accuracy, world size, fault and recovery markers) and a per-rank strip of step times (a
straggler is a bright row). The run's monitor thread only appends to the panel's buffers; a refresher thread
redraws at most ``REFRESH_HZ`` times a second. Stop, a kernel interrupt and a kernel restart all end the run.
"""

from __future__ import annotations

import html
import math
import signal
import statistics
import threading
from typing import Any

import ipywidgets as w
import plotly.graph_objects as go

from workbench import strategies
from workbench.base.errors import ConfigError, WorkbenchError
from workbench.config.devices import DEVICES
from workbench.config.preflight import prepare
from workbench.config.resize_rule import RULES
from workbench.config.run import PARALLELISMS, STRATEGIES, RunConfig
from workbench.faults import events as ev
from workbench.faults import kinds
from workbench.faults.bitflip import bit_field
from workbench.launch.session import Run, start
from workbench.workloads import registry

REFRESH_HZ = 5
# the most points a live curve sends the browser at each refresh: a long run's every step, resent 5 times a
# second, outruns the page (a stride over the run keeps its shape, the last step always shown)
LIVE_POINTS = 1000
STRIP_STEPS = 200  # the per-rank strip shows this many latest steps


# what the panel's number boxes can show: a default outside is refused, not clamped to the box
SHOWN = {"world_size": (1, 16), "checkpoint_every": (1, 100_000), "steps": (1, 10_000_000), "seed": (0, 2**31 - 1)}


def _check_shown(config: RunConfig) -> None:
    for name, (low, high) in SHOWN.items():
        value = getattr(config, name)
        if value is not None and not low <= value <= high:
            more = " (a larger run: workbench.start or workbench run)" if name == "world_size" else ""
            raise ConfigError(name, f"{value} is beyond what the lab panel shows: allowed {low}..{high}{more}")


def _with_workload(defaults: dict[str, Any]) -> dict[str, Any]:
    """``defaults``, with the demo's workload where they name neither a model nor a dataset."""
    return defaults if {"model", "dataset"} & set(defaults) else {**registry.DEMO_WORKLOAD, **defaults}


class Lab:
    """Build with any :class:`RunConfig` field as a default: ``Lab(world_size=4, strategy="shrink")``. Given
    neither a model nor a dataset, it trains the demo's workload (``registry.DEMO_WORKLOAD``: MNIST-1D's MLP). A bad
    default, or one the panel cannot show (``SHOWN``: world_size up to 16), is a one-line ConfigError."""

    def __init__(self, **defaults: Any) -> None:
        base = RunConfig.from_dict(defaults := _with_workload(defaults))
        _check_shown(base)
        if base.spawn == "template":
            from workbench.supervisor.template import prewarm

            prewarm()  # the kernel's rank template imports torch while the researcher reads the panel
        self.run: Run | None = None
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self._events: list[dict[str, Any]] = []
        self._rank_steps: list[dict[str, Any]] = []
        self._dirty = threading.Event()
        self._closed = False
        style = {"description_width": "110px"}
        self._given = dict(defaults)  # settings the panel has no control for (width, augment, ...) are kept
        names = registry.model_names()  # the registered models, read when the panel is built
        models = list(names) + ([base.model] if base.model not in names else [])  # a user factory stays offered
        self.model = w.Dropdown(options=models, value=base.model, description="model", style=style)
        # free text: the on-disk data sets take their directory (cifar10:DIR ...), a user loader its import path
        self.dataset = w.Combobox(options=list(registry.dataset_choices()), value=base.dataset, ensure_option=False,
                                  placeholder="digits, synthetic_image, cifar10:DIR, ...", description="dataset",
                                  style=style)
        self.world_size = w.BoundedIntText(value=base.world_size, min=1, max=SHOWN["world_size"][1],
                                           description="world size", style=style)
        self.parallelism = w.Dropdown(options=list(PARALLELISMS), value=base.parallelism, description="parallelism",
                                      style=style)
        self.strategy = w.Dropdown(options=list(STRATEGIES), value=base.strategy, description="strategy", style=style)
        self.regrow = w.Checkbox(value=base.regrow, description="regrow (warm spare)")
        self.checkpoint_every = w.BoundedIntText(value=base.checkpoint_every or 25, min=1,
                                                 max=SHOWN["checkpoint_every"][1], description="checkpoint every",
                                                 style=style)
        self.detect = w.SelectMultiple(options=["guard", "spike", "fingerprint"], value=tuple(base.detect),
                                       description="detectors", rows=3, style=style)
        self.resize_rule = w.Dropdown(options=RULES, value=base.resize_rule, description="resize rule", style=style)
        self.steps = w.BoundedIntText(value=base.steps, min=1, max=10_000_000, description="steps", style=style)
        self.seed = w.BoundedIntText(value=base.seed, min=0, max=2**31 - 1, description="seed", style=style)
        self.device = w.Dropdown(options=list(DEVICES), value=base.device, description="device", style=style)
        self.start_button = w.Button(description="Start", button_style="success", icon="play")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.start_button.on_click(lambda _b: self.start())
        self.stop_button.on_click(lambda _b: self.stop())
        self.rank_buttons = w.HBox([])
        self.resize_world = w.BoundedIntText(value=base.world_size, min=1, max=SHOWN["world_size"][1],
                                             description="world", layout={"width": "150px"})
        self.resize_button = w.Button(description="Resize", icon="arrows-h", disabled=True)
        self.resize_button.on_click(lambda _b: self.resize(self.resize_world.value))
        self.slow_factor = w.BoundedFloatText(value=3.0, min=1.0, max=100.0, step=0.5, description="slow factor",
                                              style=style, layout={"width": "200px"})
        self.flip_rank = w.Dropdown(options=[], description="rank", layout={"width": "150px"})
        self.flip_target = w.Dropdown(options=["weight", "buffer", "grad", "grad_local", "optimizer"], value="weight",
                                      description="target", layout={"width": "220px"})
        self.flip_tensor = w.Dropdown(options=[], description="tensor", layout={"width": "260px"})
        self._flip_names: dict[str, list[str]] = {"buffer": [], "other": []}
        self.flip_target.observe(lambda _change: self._offer_flip_tensors(), names="value")
        self.flip_index = w.IntText(value=-1, description="index (-1: random)", style={"description_width": "120px"},
                                    layout={"width": "220px"})
        self.flip_bit = w.BoundedIntText(value=30, min=0, max=31, description="bit", layout={"width": "150px"})
        self.flip_field = w.Label(value=self._field_text(30))
        self.flip_bit.observe(lambda change: setattr(self.flip_field, "value", self._field_text(change["new"])),
                              names="value")
        self.flip_button = w.Button(description="Flip", icon="bolt", disabled=True)
        self.flip_button.on_click(lambda _b: self.flip())
        self.status = w.HTML(value="<b>idle</b>", _dom_classes=["wb-lab-status"])  # the class: for the browser test
        self.figure = self._make_figure()
        strip = go.Figure(go.Heatmap(colorscale="YlOrRd", zmin=0.5, zmax=3.0, colorbar={"title": "x median"}))
        strip.update_layout(template="plotly_white", height=200, xaxis_title="step", margin={"t": 40, "b": 40},
                            title="per-rank step time (own CPU per step, x the step's median)")
        self.strip = go.FigureWidget(strip)  # built whole: see _make_figure
        config_box = w.GridBox([self.model, self.dataset, self.world_size, self.parallelism, self.strategy, self.regrow,
                                self.checkpoint_every, self.detect, self.resize_rule, self.steps, self.seed,
                                self.device], layout=w.Layout(grid_template_columns="repeat(3, 330px)"))
        flip_box = w.HBox([self.flip_rank, self.flip_target, self.flip_tensor, self.flip_index, self.flip_bit,
                           self.flip_field, self.flip_button])
        self.widget = w.VBox([config_box, w.HBox([self.start_button, self.stop_button]), self.rank_buttons,
                              w.HBox([self.resize_world, self.resize_button, self.slow_factor]), flip_box, self.status,
                              self.figure, self.strip])
        self._previous_sigint = None
        self._refresher = threading.Thread(target=self._refresh_loop, name="workbench-lab-refresh", daemon=True)
        self._refresher.start()

    # -- display ---------------------------------------------------------------------------------------------
    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def config(self) -> RunConfig:
        return RunConfig.from_dict({
            **self._given, "model": self.model.value, "dataset": self.dataset.value.strip(),
            "world_size": self.world_size.value, "parallelism": self.parallelism.value,
            "strategy": self.strategy.value, "regrow": self.regrow.value,
            "checkpoint_every": self.checkpoint_every.value if self._given.get("checkpoint_every") is not None
            or strategies.get(self.strategy.value).checkpoint_every is not None else None,
            "detect": list(self.detect.value), "resize_rule": self.resize_rule.value, "steps": self.steps.value,
            "seed": self.seed.value, "device": self.device.value,
            "eval_interval": self._given.get("eval_interval", max(1, min(25, self.steps.value // 10)))})

    def _offer_flip_tensors(self) -> None:
        """The tensor dropdown lists buffers (batch norm's running statistics) for target=buffer, else parameters."""
        names = self._flip_names["buffer" if self.flip_target.value == "buffer" else "other"]
        self.flip_tensor.options = names
        self.flip_tensor.value = names[0] if names else None

    # -- actions ---------------------------------------------------------------------------------------------
    def start(self) -> Run | None:
        if self.run is not None and not self.run.done:
            return self.run
        try:
            config = prepare(self.config())  # the data, the model and a resumed file checked before any rank
        except WorkbenchError as exc:
            self.status.value = f"<b style='color:crimson'>{exc}</b>"
            return None
        with self._lock:
            self._rows, self._events, self._rank_steps = [], [], []
        self._reset_figure(config.world_size)
        self._make_rank_buttons(config.world_size)
        from workbench.workloads.stages import buffer_tensors, model_tensors

        params, _ = model_tensors(config)
        self._flip_names = {"buffer": list(buffer_tensors(config)), "other": list(params)}
        self._offer_flip_tensors()
        self.flip_rank.options = list(range(config.world_size))
        self.flip_rank.value = 0
        self.run = start(config, on_event=self._on_event)
        self._watch_interrupts()
        self.start_button.disabled, self.stop_button.disabled, self.flip_button.disabled = True, False, False
        self.resize_button.disabled = False
        self._dirty.set()
        return self.run

    def stop(self) -> None:
        if self.run is not None:
            self.run.stop("stopped from the lab")

    def kill(self, rank: int) -> None:
        self._live_fault("kill", rank)

    def hang(self, rank: int) -> None:
        self._live_fault("hang", rank)

    def stall(self, rank: int) -> None:
        self._live_fault("stall", rank)

    def preempt(self, rank: int) -> None:
        """Notice with the run's ``preempt_grace``: the rank leaves at a step boundary."""
        self._live_fault("preempt", rank)

    def resize(self, world: int) -> None:
        """Grow or shrink the running world at its next step boundary; a size it cannot take is said in the status
        line."""
        try:
            if self.run is not None:
                self.run.resize(world)
        except WorkbenchError as exc:
            self.status.value = f"<b style='color:crimson'>{exc}</b>"

    def slow(self, rank: int) -> None:
        """Slow ``rank`` down by the factor in the box (1: full speed again)."""
        self._live_fault("slow", rank, factor=self.slow_factor.value)

    def _live_fault(self, kind: str, rank: int, **more: Any) -> None:
        """A button of a rank that died (or of an ended run) before the panel greyed it: said in the status line."""
        try:
            if self.run is not None:
                getattr(self.run, kind)(rank, **more)
        except WorkbenchError as exc:
            self.status.value = f"<b style='color:crimson'>{exc}</b>"

    def flip(self) -> None:
        if self.run is None or self.flip_rank.value is None:
            return
        try:
            self.run.flip(rank=self.flip_rank.value, target=self.flip_target.value, tensor=self.flip_tensor.value,
                          index=None if self.flip_index.value < 0 else self.flip_index.value, bit=self.flip_bit.value,
                          seed=len(self._events))
        except WorkbenchError as exc:
            self.status.value = f"<b style='color:crimson'>{exc}</b>"

    def close(self) -> None:
        """Stop the run and the refresher; the panel stays on screen, inert."""
        self.stop()
        self._closed = True
        self._dirty.set()
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None

    # -- internals -------------------------------------------------------------------------------------------
    @staticmethod
    def _field_text(bit: int) -> str:
        return f"fp32 {bit_field('float32', bit)}"

    def _watch_interrupts(self) -> None:
        """A kernel interrupt (SIGINT) also stops the run, then does what it did before."""
        if self._previous_sigint is not None or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)

        def on_interrupt(signum: int, frame: Any) -> None:
            self.stop()
            if callable(previous):
                previous(signum, frame)

        self._previous_sigint = previous
        signal.signal(signal.SIGINT, on_interrupt)

    def _make_rank_buttons(self, world_size: int) -> None:
        """A column of fault buttons per rank number below ``world_size`` (a grown world gets more)."""
        buttons = []
        for rank in range(world_size):
            column = []
            for kind, style in kinds.BUTTONS.items():  # each kind's object: its button (the lab's method of its name)
                button = w.Button(description=f"{kind.title()} {rank}", button_style=style, layout={"width": "90px"})
                button.on_click(lambda _b, r=rank, k=kind: getattr(self, k)(r))
                column.append(button)
            buttons.append(w.VBox(column))
        self.rank_buttons.children = buttons

    def _make_figure(self) -> go.FigureWidget:
        """The live figure, built whole before it becomes a widget: its traces and layout then travel in the
        widget's first state. Added to a widget already made, they travel as one-shot messages, which a browser
        still loading plotly's widget code drops: the panel then shows empty axes for good."""
        fig = go.Figure()
        fig.update_layout(template="plotly_white", height=420, xaxis_title="step", hovermode="closest",
                          yaxis={"title": "loss"}, yaxis2={"title": "accuracy / world size", "overlaying": "y",
                                                           "side": "right", "range": [0, 1.1]},
                          legend={"orientation": "h", "y": -0.2})
        fig.add_scatter(name="training loss", mode="lines")
        fig.add_scatter(name="test accuracy", mode="lines+markers", yaxis="y2")
        fig.add_scatter(name="world size (fraction)", mode="lines", yaxis="y2", line={"shape": "hv", "dash": "dot"})
        for kind in ev.marked(live=True):  # each marked kind's marker: its declaration (supervisor.events)
            fig.add_scatter(name=kind.name, mode="markers", yaxis="y2", hoverinfo="text",
                            marker={"symbol": kind.marker.symbol, "size": 12, "color": kind.marker.colour})
        return go.FigureWidget(fig)

    def _reset_figure(self, world_size: int) -> None:
        self._world_size = world_size
        with self.figure.batch_update():
            for trace in self.figure.data:
                trace.x, trace.y = [], []

    def _on_event(self, kind: str, payload: dict[str, Any]) -> None:  # the run's monitor thread
        with self._lock:
            {"step": self._rows, "rank_step": self._rank_steps}.get(kind, self._events).append(payload)
            if len(self._rank_steps) > 2 * STRIP_STEPS * SHOWN["world_size"][1]:
                del self._rank_steps[:-STRIP_STEPS * SHOWN["world_size"][1]]  # the strip shows the latest only
        self._dirty.set()

    def _refresh_loop(self) -> None:
        while not self._closed:
            live = self.run is not None and (not self.run.done or self.run.result is None)
            self._dirty.wait(timeout=0.5 if live else None)
            self._dirty.clear()
            try:
                self._redraw()
            except Exception as exc:  # noqa: BLE001 - a drawing error must not end the refresher; it is shown
                reason = html.escape(repr(exc)[:300])
                self.status.value = f"<b style='color:crimson'>the panel could not redraw: {reason}</b>"
            threading.Event().wait(1.0 / REFRESH_HZ)

    def _redraw(self) -> None:
        with self._lock:
            rows, events, rank_steps = list(self._rows), list(self._events), list(self._rank_steps)
        run = self.run
        status = run.status if run is not None else {}
        members = set(status.get("members", []))
        if members and max(members) >= len(self.rank_buttons.children):
            self._make_rank_buttons(max(members) + 1)  # a resize added ranks
        shown = thinned(rows)
        with self.figure.batch_update():
            loss, acc, world = self.figure.data[0], self.figure.data[1], self.figure.data[2]
            loss.x, loss.y = [r["step"] for r in shown], [r["loss"] for r in shown]
            evals = thinned([r for r in rows if not math.isnan(r["test_acc"])])
            acc.x, acc.y = [r["step"] for r in evals], [r["test_acc"] for r in evals]
            world.x, world.y = [r["step"] for r in shown], [r["world_size"] / self._world_size for r in shown]
            for trace, kind in zip(self.figure.data[3:], ev.marked(live=True)):
                marks = ev.of(events, kind)
                trace.x = [max(e["step"], 0) for e in marks]
                trace.y = [1.04] * len(marks)
                trace.hovertext = [f"{kind.name}: {ev.text(e)}" for e in marks]
        self._redraw_strip(rank_steps)
        for rank, box in enumerate(self.rank_buttons.children):
            gone = bool(members) and rank not in members  # failed, or left (a resize, a preemption)
            for button in box.children:
                button.disabled = gone or run is None or run.done
        if run is not None and run.done and run.result is not None:
            summary = run.result.summary
            self.status.value = (f"<b>{summary['outcome']}</b>: {summary['reason']} — test accuracy "
                                 f"{summary['final_test_accuracy'] or float('nan'):.4f}, world size "
                                 f"{summary['world_size_final']}; training {summary['train_s']:.2f} s on the wall "
                                 f"clock, {summary.get('rank_train_s') or float('nan'):.2f} s on the rank-time "
                                 f"clock (the figure's axis is the step)")
            self.start_button.disabled, self.stop_button.disabled, self.flip_button.disabled = False, True, True
            self.resize_button.disabled = True
        elif run is not None:
            self.status.value = (f"<b>{status.get('state')}</b> — generation {status.get('generation')}, world size "
                                 f"{status.get('world_size')}, step {status.get('step')}, ranks "
                                 f"{status.get('members', [])}")

    def _redraw_strip(self, rank_steps: list[dict[str, Any]]) -> None:
        """The per-rank strip: each rank's step time over the step's median across ranks, latest steps."""
        by_step: dict[int, dict[int, float]] = {}
        for r in rank_steps:
            by_step.setdefault(r["step"], {})[r["rank"]] = r["cpu_s"]  # a redone step: its latest
        steps = sorted(by_step)[-STRIP_STEPS:]
        ranks = sorted({rank for s in steps for rank in by_step[s]})
        grid = []
        for rank in ranks:
            row = []
            for s in steps:
                median = statistics.median(by_step[s].values())
                row.append(by_step[s][rank] / median if rank in by_step[s] and median > 0 else None)
            grid.append(row)
        with self.strip.batch_update():
            heat = self.strip.data[0]
            heat.x, heat.y, heat.z = steps, [f"rank {r}" for r in ranks], grid


def thinned(rows: list[dict[str, Any]], most: int = LIVE_POINTS) -> list[dict[str, Any]]:
    """At most ``most`` (+1) of ``rows``: every k-th over the whole run, and the last one."""
    if len(rows) <= most:
        return rows
    kept = rows[::math.ceil(len(rows) / most)]
    return kept if kept[-1] is rows[-1] else [*kept, rows[-1]]
