"""Device resolution: what exists is returned, what does not is one clear line."""

from __future__ import annotations

import pytest
import torch

from napari_finetune.devices import (
    DeviceUnavailableError,
    check_model_fits_image,
    model_device,
    resolve_device,
)
from napari_finetune.model.unet import UNet


def test_cpu_and_auto_resolve(monkeypatch):
    assert resolve_device("cpu") == "cpu"
    # auto takes CUDA first, then MPS, then the CPU; the availability queries stand in
    # for machines this one is not.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == "mps"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"


def test_unknown_name_is_refused():
    with pytest.raises(DeviceUnavailableError, match="unknown device 'gpu'"):
        resolve_device("gpu")


def test_cuda_index_beyond_the_gpus_is_refused(monkeypatch):
    # A GPU cannot exist here: the two queries stand in for a 1-GPU machine.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(DeviceUnavailableError, match="has 1 CUDA GPU"):
        resolve_device("cuda:1")


def test_model_device_and_dims_check():
    model = UNet(dims=3, depth=2, features=4)
    assert model_device(model) == torch.device("cpu")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")
    check_model_fits_image(model, (8, 16, 16))
    check_model_fits_image(torch.nn.Identity(), (16, 16))  # says nothing: assumed to fit
    with pytest.raises(ValueError, match="the model is 3D but the image has shape"):
        check_model_fits_image(model, (16, 16))
