"""Bit-sensitivity trials on disk (:func:`workbench.campaigns.studies.sensitivity.bit_sensitivity`'s table): a
sweep point keeps them as ``sensitivity.h5``, where ``workbench report`` finds them."""

from __future__ import annotations

import os
from typing import Any

from workbench.results.run_result import load_table, save_table

SENSITIVITY_FILE = "sensitivity.h5"


def save_trials(frame: Any, path: str | os.PathLike) -> Any:
    """Write the trials of :func:`bit_sensitivity` to HDF5 (atomically; ``golden_accuracy`` kept), e.g. as
    ``out/sensitivity.h5`` of a sweep point, where ``workbench report`` finds them."""
    return save_table(frame, path, golden_accuracy=frame.attrs.get("golden_accuracy"))


def load_trials(path: str | os.PathLike) -> Any:
    """The trials saved by :func:`save_trials`, as a DataFrame."""
    frame, attrs = load_table(path)
    frame.attrs["golden_accuracy"] = attrs.get("golden_accuracy")
    return frame
