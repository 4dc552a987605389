"""What a rank reads off a whole model: its test (and validation) figures, and the fingerprint by which
data-parallel replicas are compared bit for bit. Used by our ranks and the peers'."""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.nn.functional as F


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Any) -> dict[str, float]:
    """Test loss and accuracy of a whole model (ours and the peers'), and validation accuracy where the data
    has a validation split (``val_acc``: what apoptosis decides on)."""
    training = model.training
    model.eval()
    device = next(model.parameters()).device  # a GPU rank's model: the test set goes there (a no-op on the CPU)
    out, y_test = model(data.x_test.to(device)), data.y_test.to(device)
    figures = {"test_loss": F.cross_entropy(out, y_test).item(),
               "test_acc": (out.argmax(1) == y_test).float().mean().item()}
    if getattr(data, "x_val", None) is not None:
        figures["val_acc"] = (model(data.x_val.to(device)).argmax(1) == data.y_val.to(device)).float().mean().item()
    model.train(training)
    return figures


def fingerprint(model: torch.nn.Module) -> str:
    """Hash of every parameter's and buffer's bytes (batch norm's running statistics included): data-parallel
    replicas must agree bit for bit."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]
