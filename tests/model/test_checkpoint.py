"""Checkpoints: atomic writes, safe loading, clear errors."""

from __future__ import annotations

import pytest
import torch

from napari_finetune.loading import load_checkpoint
from napari_finetune.model import checkpoint as ckpt_module
from napari_finetune.model.bring_your_own import checkpoint_from_factory
from napari_finetune.model.checkpoint import (
    CheckpointError,
    describe_checkpoint,
    save_checkpoint,
)
from napari_finetune.model.unet import UNet


def _model():
    torch.manual_seed(0)
    return UNet(dims=3, depth=1, features=4, norm="batch")


def test_round_trip_same_outputs_and_weights_only(tmp_path):
    model = _model().eval()
    path = save_checkpoint(tmp_path / "m.pt", model, {"channel_names": ["a", "b"]})
    payload = torch.load(path, weights_only=True)
    assert payload["format"] == "napari-finetune-checkpoint"
    loaded = load_checkpoint(path)
    x = torch.rand(1, 1, 4, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x), model(x), rtol=0, atol=0)
    assert loaded.channel_names == ["a", "b"] and len(loaded.sha256) == 64
    assert not loaded.model.training
    assert "channels:      a, b" in describe_checkpoint(loaded)


def test_failed_save_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "m.pt", _model())
    before = path.read_bytes()

    def broken_save(obj, handle, *args, **kwargs):
        handle.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_module.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, UNet(dims=3, depth=1, features=8))
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt"]
    assert path.read_bytes() == before


def test_corrupt_file_is_a_checkpoint_error(tmp_path):
    path = save_checkpoint(tmp_path / "m.pt", _model())
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="not a readable PyTorch checkpoint"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing.pt")


def test_wrong_format_gets_a_clear_error(tmp_path):
    bare = tmp_path / "bare.pt"
    torch.save(_model().state_dict(), bare)
    with pytest.raises(CheckpointError, match="not a napari-finetune checkpoint"):
        load_checkpoint(bare)
    # ...and the message's advice works: wrap the bare state dict.
    wrapped = checkpoint_from_factory(
        tmp_path / "wrapped.pt", "napari_finetune.model.unet:UNet",
        {"dims": 3, "depth": 1, "features": 4, "norm": "batch"}, bare,
    )
    assert isinstance(load_checkpoint(wrapped).model, UNet)


def test_weights_that_do_not_fit_the_architecture(tmp_path):
    path = save_checkpoint(tmp_path / "m.pt", _model())
    payload = torch.load(path, weights_only=True)
    payload["architecture"]["kwargs"]["features"] = 8
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="do not fit"):
        load_checkpoint(path)


def test_saved_file_gets_the_umask_mode_not_a_private_one(tmp_path):
    import os

    umask = os.umask(0o022)
    try:
        path = save_checkpoint(tmp_path / "m.pt", UNet(dims=2, depth=1, features=4))
    finally:
        os.umask(umask)
    # Collaborators on a shared workstation must be able to read an export.
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_names_that_moved_stay_importable_from_the_checkpoint_module():
    from napari_finetune.model import bring_your_own, factory

    assert ckpt_module.checkpoint_from_factory is bring_your_own.checkpoint_from_factory
    assert ckpt_module.call_factory is factory.call_factory
    with pytest.raises(AttributeError):
        ckpt_module.no_such_name  # noqa: B018


def test_the_public_path_is_the_loader_and_importing_it_stays_on_the_model_floor():
    # Outside checks call model.checkpoint.load_checkpoint; importing that module must
    # not import the loader or the bioimage.io reader above it (only calling it does).
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import napari_finetune.model.checkpoint\n"
        "above = [m for m in sys.modules if m.startswith(('napari_finetune.loading', "
        "'napari_finetune.bioimageio'))]\n"
        "assert not above, above\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_public_path_opens_our_checkpoint_as_the_loader_does(tmp_path):
    path = save_checkpoint(tmp_path / "m.pt", _model(), {"channel_names": ["a", "b"]})
    public, loaded = ckpt_module.load_checkpoint(path), load_checkpoint(path)
    assert public.sha256 == loaded.sha256 and public.architecture == loaded.architecture
    assert public.channel_names == ["a", "b"]
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        ckpt_module.load_checkpoint(tmp_path / "missing.pt")
