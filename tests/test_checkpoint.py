import h5py
import numpy as np
import pytest
import torch

from workbench.base import checkpoint
from workbench.base.checkpoint import Checkpoint, CheckpointCorrupt
from workbench.base.h5files import FileKindError


def sample(step=7):
    return Checkpoint(step, {"fc1.weight": torch.arange(6.0).reshape(2, 3), "fc1.bias": torch.ones(2)},
                      {"fc1.weight": {"momentum_buffer": torch.full((2, 3), 0.5)}}, torch.get_rng_state(), seed=3,
                      config={"world_size": 2})


def test_round_trip_layout_and_checksums(tmp_path):
    path = checkpoint.save(tmp_path / "c" / checkpoint.checkpoint_name(7), sample())
    assert path.name == "step_000007.h5" and not list(path.parent.glob(".*"))  # no temporary left behind
    assert set(checkpoint.datasets(path)) == {"model/fc1.weight", "model/fc1.bias",
                                              "optimizer/fc1.weight/momentum_buffer", "rng/torch"}
    with h5py.File(path) as f:
        assert f.attrs["data_cursor"] == 7 and all("sha256" in f[n].attrs for n in ("model/fc1.bias",))
    loaded = checkpoint.load(path)
    assert loaded.step == 7 and loaded.seed == 3 and loaded.config == {"world_size": 2}
    torch.testing.assert_close(loaded.model["fc1.weight"], sample().model["fc1.weight"])
    torch.testing.assert_close(loaded.optimizer["fc1.weight"]["momentum_buffer"], torch.full((2, 3), 0.5))


def test_verify_names_every_altered_dataset(tmp_path):
    path = checkpoint.save(tmp_path / "c.h5", sample())
    assert checkpoint.verify(path) == []
    with h5py.File(path, "r+") as f:
        data = f["model/fc1.bias"][()]
        data.view(np.uint32)[0] ^= 1 << 30
        f["model/fc1.bias"][...] = data
    assert checkpoint.verify(path) == ["model/fc1.bias"]
    with pytest.raises(CheckpointCorrupt, match="model/fc1.bias"):
        checkpoint.load(path)
    assert checkpoint.load(path, check=False).model["fc1.bias"][0].item() > 1e38


def test_not_a_checkpoint(tmp_path):
    bogus = tmp_path / "x.h5"
    bogus.write_bytes(b"not hdf5")
    with pytest.raises(FileKindError, match="is not an HDF5 file"):
        checkpoint.verify(bogus)
