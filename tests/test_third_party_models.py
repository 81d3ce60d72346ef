"""Models of MONAI and torch-em, given as they are: fine-tune -> export -> reload -> predict.

Each family is fine-tuned for two steps on a tiny volume (full and LoRA),
exported, read back with ``torch.load(weights_only=True)`` through
``load_checkpoint``, and predicted blockwise on a 30x100x100 volume, whose sizes
no UNet here divides (MONAI UNet needs multiples of 4, BasicUNet 16, torch-em
AnisotropicUNet 2 in z and 4 in y, x).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_finetune.config import FinetuneConfig, PredictConfig
from napari_finetune.model.checkpoint import load_checkpoint
from napari_finetune.predict import predict_block, predict_volume
from napari_finetune.trainer.loop import Finetuner
from third_party import monai_nets, torch_em_model


def _monai_unet():
    return monai_nets().UNet(
        spatial_dims=3, in_channels=1, out_channels=2, channels=(4, 8, 8), strides=(2, 2),
        num_res_units=1,
    )


def _monai_basic_unet():
    return monai_nets().BasicUNet(spatial_dims=3, out_channels=2, features=(2, 2, 2, 2, 2, 2))


def _torch_em_unet3d():
    return torch_em_model().UNet3d(in_channels=1, out_channels=2, depth=2, initial_features=2)


def _torch_em_anisotropic():
    return torch_em_model().AnisotropicUNet(
        in_channels=1, out_channels=2, scale_factors=[[1, 2, 2], [2, 2, 2]], initial_features=2
    )


FAMILIES = {
    "MONAI UNet": _monai_unet,
    "MONAI BasicUNet": _monai_basic_unet,
    "torch-em UNet3d": _torch_em_unet3d,
    "torch-em AnisotropicUNet": _torch_em_anisotropic,
}
CASES = [(family, mode) for family in FAMILIES for mode in ("full", "lora")]


@pytest.mark.parametrize(("family", "mode"), CASES, ids=[f"{f}-{m}" for f, m in CASES])
def test_finetune_export_reload_predict(tmp_path, family, mode):
    model = FAMILIES[family]()  # built by the user, not through a checkpoint factory
    rng = np.random.default_rng(0)
    image = rng.random((16, 32, 32), dtype=np.float32)
    corrections = np.zeros(image.shape, np.uint8)
    corrections[4:8, 4:16, 4:16] = 1
    corrections[8:12, 12:28, 12:28] = 2
    config = FinetuneConfig(
        steps=2, batch_size=1, patch_shape=(16, 32, 32), mode=mode, lora_rank=2,
        device="cpu", mixed_precision=False, distillation=0.5,
    )
    trainer = Finetuner(model, image, corrections, config)
    assert [s.kind for s in trainer.run()][-1] == "finished"

    path = trainer.export(tmp_path / "tuned.pt")
    payload = torch.load(path, weights_only=True)  # plain types only
    run = payload["metadata"]["run"]
    if mode == "lora":
        assert run["lora_layers"], "the record names the adapted layers"
    else:
        assert run["lora_layers"] == []
    loaded = load_checkpoint(path)
    assert loaded.channel_names == ["channel_0", "channel_1"]

    # The reloaded model predicts what the trained one does (adapters merged).
    block = rng.random((16, 32, 32), dtype=np.float32)
    expected = predict_block(trainer.model, block)
    np.testing.assert_allclose(predict_block(loaded.model, block), expected, atol=1e-4)

    volume = rng.random((30, 100, 100), dtype=np.float32)
    config = PredictConfig(block_shape=(16, 48, 48), halo=(4, 8, 8), device="cpu")
    probs = predict_volume(loaded.model, volume, (0.0, 1.0), config)
    assert probs.shape == (2, 30, 100, 100)
    assert np.isfinite(probs).all() and 0.0 <= probs.min() and probs.max() <= 1.0


def test_torch_em_export_names_its_block_class(tmp_path):
    model = _torch_em_unet3d()
    from napari_finetune.model.checkpoint import save_checkpoint

    path = save_checkpoint(tmp_path / "m.pt", model.eval())
    architecture = torch.load(path, weights_only=True)["architecture"]
    assert architecture["kwargs"]["conv_block_impl"] == "torch_em.model.unet:ConvBlock3d"
    assert architecture["callable_kwargs"] == ["conv_block_impl"]
    loaded = load_checkpoint(path).model
    assert type(loaded.init_kwargs["conv_block_impl"]).__name__ == "type"
    x = torch.rand(1, 1, 8, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_torch_em_unet2d_rebuilds_with_its_pooler_and_sampler_classes(tmp_path):
    from napari_finetune.model.checkpoint import save_checkpoint
    from napari_finetune.model.geometry import model_geometry

    model = torch_em_model().UNet2d(in_channels=1, out_channels=3, depth=3, initial_features=2)
    assert model_geometry(model, 2).multiple == (8, 8)
    path = save_checkpoint(tmp_path / "m.pt", model.eval())
    architecture = torch.load(path, weights_only=True)["architecture"]
    callables = {"conv_block_impl", "pooler_impl", "sampler_impl"}
    assert set(architecture["callable_kwargs"]) == callables
    loaded = load_checkpoint(path)
    image = np.random.default_rng(1).random((36, 50), dtype=np.float32)
    probs = predict_volume(loaded.model, image, (0.0, 1.0), PredictConfig(device="cpu"))
    assert probs.shape == (3, 36, 50)
    np.testing.assert_allclose(probs, predict_block(model, image), atol=1e-6)
