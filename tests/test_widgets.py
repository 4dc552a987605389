"""The lab panel driven from Python, as its buttons would (the browser test drives the real page)."""

import struct
import time

import pytest

from workbench.faults import events
from workbench.launch.lab import Lab

MARKED = [k.name for k in events.marked(live=True)]  # the kinds the live figure marks

pytestmark = pytest.mark.usefixtures("no_leaks")


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def trace(lab, name):
    return next(t for t in lab.figure.data if t.name == name)


def ieee_flip(value, bit):
    """The float32 ``value`` with bit ``bit`` (LSB-0) flipped, computed independently of the workbench."""
    (word,) = struct.unpack("<I", struct.pack("<f", value))
    return struct.unpack("<f", struct.pack("<I", word ^ (1 << bit)))[0]


def check_flip_event(lab, rank, target, tensor, index, bit):
    """The panel's flip landed where its form named: that rank, tensor, element and bit, and the value changed
    by exactly that bit (an IEEE float32 flip of the value the rank held)."""
    (event,) = [e for e in lab.run.events if e["kind"] == "flip"]
    head, values = event["detail"].split(": ")
    old, new = (float(v) for v in values.split(" -> "))
    assert (event["rank"], head) == (rank, f"{target} {tensor}[{index}] bit {bit}"), event
    assert new == ieee_flip(old, bit) and new != old, event


def test_panel_runs_kills_and_shows_it():
    lab = Lab(world_size=3, steps=100_000, strategy="shrink")
    try:
        lab.start_button.click()
        wait_for(lambda: len(trace(lab, "training loss").x) > 20)  # the curve moves
        assert lab.flip_tensor.options[0] == "linear1.weight" and len(lab.rank_buttons.children) == 3  # MNIST-1D MLP
        lab.rank_buttons.children[1].children[0].click()  # "Kill 1"
        wait_for(lambda: "generation 1" in lab.status.value and len(trace(lab, "kill").x) == 1)
        assert "rank 1" in trace(lab, "kill").hovertext[0]
        wait_for(lambda: all(b.disabled for b in lab.rank_buttons.children[1].children))
        assert not lab.rank_buttons.children[0].children[0].disabled
        lab.flip_bit.value = 23
        assert lab.flip_field.value == "fp32 exponent"
        lab.flip_rank.value, lab.flip_index.value = 2, 3
        lab.flip_button.click()
        wait_for(lambda: len(trace(lab, "flip").x) == 1)
        check_flip_event(lab, 2, "weight", "linear1.weight", 3, 23)
    finally:
        lab.stop_button.click()
    wait_for(lambda: lab.run.result is not None and "stopped" in lab.status.value)
    assert lab.start_button.disabled is False and set(MARKED) <= {t.name for t in lab.figure.data}
    lab.close()


def test_the_figures_travel_whole_in_the_widgets_first_state():
    """A browser still loading plotly's widget code drops the one-shot messages that add traces and layout to a
    widget already made (the panel then showed empty axes for good, once in CI): both figures are built before
    they become widgets, so their traces and layout are in the state the browser receives first."""
    lab = Lab(world_size=2, steps=10)
    try:
        names = [t["name"] for t in lab.figure._widget_data]
        assert names[:3] == ["training loss", "test accuracy", "world size (fraction)"] and names[3:] == list(MARKED)
        assert lab.figure._widget_layout["yaxis"]["title"]["text"] == "loss"
        assert [t["type"] for t in lab.strip._widget_data] == ["heatmap"]
        assert lab.strip._widget_layout["xaxis"]["title"]["text"] == "step"
    finally:
        lab.close()


def test_panel_preempts_a_rank_and_resizes_the_world():
    lab = Lab(world_size=2, steps=100_000, strategy="shrink", preempt_grace=10)
    try:
        lab.start_button.click()
        wait_for(lambda: len(trace(lab, "training loss").x) > 5)
        lab.resize_world.value = 3
        lab.resize_button.click()
        wait_for(lambda: len(lab.rank_buttons.children) == 3 and "ranks [0, 1, 2]" in lab.status.value)
        assert [b.description for b in lab.rank_buttons.children[2].children] == \
            ["Kill 2", "Hang 2", "Stall 2", "Preempt 2", "Slow 2"]
        lab.rank_buttons.children[1].children[3].click()  # "Preempt 1"
        wait_for(lambda: all(b.disabled for b in lab.rank_buttons.children[1].children))
        assert len(trace(lab, "preempt").x) == 1 and "ranks [0, 2]" in lab.status.value
        assert len(trace(lab, "resize").x) >= 1
    finally:
        lab.stop_button.click()
    wait_for(lambda: lab.run.result is not None and "stopped" in lab.status.value)
    assert lab.resize_button.disabled
    lab.close()


def test_bad_configuration_shows_in_the_status_line():
    lab = Lab()
    lab.steps.value = 5
    lab.world_size.value = 8
    lab.seed.value = 1
    lab.detect.value = ("guard",)
    lab.strategy.value = "none"
    lab.regrow.value = True  # regrow does not combine with 'none'
    assert lab.start() is None and "regrow" in lab.status.value
    lab.close()


def test_a_redraw_that_fails_is_shown_in_the_status_line_and_the_next_one_still_draws(monkeypatch):
    lab = Lab()
    draw = Lab._redraw
    failures = iter([True])

    def flaky(self):
        if next(failures, False):
            raise ValueError("a <bad> figure")
        draw(self)
        self.status.value += " drawn again"

    monkeypatch.setattr(Lab, "_redraw", flaky)
    lab._dirty.set()
    wait_for(lambda: "could not redraw" in lab.status.value)
    assert "a &lt;bad&gt; figure" in lab.status.value  # escaped: the line stays HTML
    lab._dirty.set()
    wait_for(lambda: "drawn again" in lab.status.value)
    lab.close()


def test_parallelism_is_chosen_in_the_panel_and_bad_choices_are_explained():
    lab = Lab(world_size=3)
    assert set(lab.parallelism.options) == {"data", "pipeline", "gossip", "hybrid"}
    lab.parallelism.value = "gossip"
    assert lab.start() is None  # nothing started
    assert "not a power of two" in lab.status.value
    lab.world_size.value = 2
    assert lab.config().parallelism == "gossip"


def test_the_panel_offers_every_model_a_dataset_box_and_buffer_flips(tmp_path):
    lab = Lab(world_size=2, steps=100_000, model="resnet20", width=0.5)
    try:
        assert {"mlp", "lenet5", "vgg11", "resnet20", "resnet18"} <= set(lab.model.options)
        assert lab.model.value == "resnet20" and "cifar10:" in lab.dataset.options
        lab.dataset.value = f"cifar10:{tmp_path}"  # free text: an empty directory is refused with the files expected
        assert lab.start() is None and "data_batch_1.bin" in lab.status.value
        lab.dataset.value = "digits"
        assert lab.config().width == 0.5  # a setting the panel has no control for is kept
        lab.start_button.click()
        wait_for(lambda: len(trace(lab, "training loss").x) > 2)
        lab.flip_target.value = "buffer"
        assert "bn1.running_var" in lab.flip_tensor.options and "conv1.weight" not in lab.flip_tensor.options
        lab.flip_tensor.value, lab.flip_bit.value = "bn1.running_var", 30
        lab.flip_rank.value, lab.flip_index.value = 1, 0
        lab.flip_button.click()
        wait_for(lambda: len(trace(lab, "flip").x) == 1)
        assert "bn1.running_var" in trace(lab, "flip").hovertext[0]
        check_flip_event(lab, 1, "buffer", "bn1.running_var", 0, 30)
    finally:
        lab.stop_button.click()
    wait_for(lambda: lab.run.result is not None)
    lab.close()


def test_a_long_run_sends_the_browser_a_thinned_curve_that_ends_at_its_last_step():
    from workbench.launch.lab import LIVE_POINTS, thinned

    rows = [{"step": s} for s in range(1, 6017)]
    shown = thinned(rows)
    assert len(shown) <= LIVE_POINTS + 1 and shown[0]["step"] == 1 and shown[-1]["step"] == 6016
    steps = [r["step"] for r in shown]
    assert steps == sorted(set(steps)) and max(b - a for a, b in zip(steps, steps[1:])) <= 7  # even stride
    assert thinned(rows[:50]) == rows[:50]  # a short run: every step


def test_the_lab_is_a_public_name_of_the_package():
    import workbench

    assert workbench.Lab is Lab and "Lab" in workbench.__all__
