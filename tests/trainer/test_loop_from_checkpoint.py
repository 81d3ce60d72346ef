"""``Finetuner.from_checkpoint``: the one run assembly of the widget, the CLI and a Session."""

from __future__ import annotations

import numpy as np

from napari_finetune.config import FinetuneConfig
from napari_finetune.model.checkpoint import load_checkpoint
from napari_finetune.trainer.loop import Finetuner


def test_the_patch_is_fitted_to_the_image_and_the_model(checkpoint):
    ckpt = load_checkpoint(checkpoint)
    image = np.zeros((16, 42, 42), np.uint8)
    config = FinetuneConfig(steps=1, device="cpu", mode="full")  # patch (32, 64, 64)
    trainer = Finetuner.from_checkpoint(ckpt, image, np.zeros_like(image), config)
    # Cut to the image, kept a multiple of the depth-2 UNet's 4 (42 -> 40).
    assert trainer.config.patch_shape == (16, 40, 40)
    assert config.patch_shape == (32, 64, 64), "the caller's config was changed"
    assert trainer.model is ckpt.model and trainer.source_sha256 == ckpt.sha256
    assert trainer.metadata["channel_names"] == ckpt.metadata["channel_names"]
    assert trainer._parts is None and trainer.sampler is None  # nothing built yet


def test_a_patch_the_user_gave_is_kept(checkpoint):
    ckpt = load_checkpoint(checkpoint)
    image = np.zeros((16, 40, 40), np.uint8)
    config = FinetuneConfig(steps=1, device="cpu", mode="full", patch_shape=(8, 24, 24))
    trainer = Finetuner.from_checkpoint(ckpt, image, np.zeros_like(image), config,
                                        fit_patch=False)
    assert trainer.config.patch_shape == (8, 24, 24)
    fitted = Finetuner.from_checkpoint(ckpt, image, np.zeros_like(image), config)
    assert fitted.config.patch_shape == (8, 24, 24)  # already fits: unchanged


def test_the_sample_model_gets_an_anisotropic_patch_its_pooling_fits():
    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    ckpt = load_checkpoint(sample_checkpoint_path())  # depth 3, pooling 2 on every axis
    image = np.zeros((64, 256, 256), np.uint8)
    config = FinetuneConfig(steps=1, device="cpu", voxel_size=(40, 8, 8))
    fitted = Finetuner.fitted_config(ckpt.model, image, config).patch_shape
    assert fitted == (16, 88, 88)  # 640 x 704 x 704 nm, multiples of the model's 8
    assert Finetuner.fitted_config(ckpt.model, image, FinetuneConfig()).patch_shape == (
        32, 64, 64)  # unknown voxel size: as before
    # A patch the user set is only cut to the model, never reshaped.
    given = FinetuneConfig(voxel_size=(40, 8, 8), patch_shape=(32, 64, 64),
                           explicit_settings=("patch_shape",))
    assert Finetuner.fitted_config(ckpt.model, image, given).patch_shape == (32, 64, 64)


def test_a_model_pooling_z_less_gets_its_own_z_multiple(checkpoint):
    from napari_finetune.model.unet import UNet

    model = UNet.for_voxel_size((40, 8, 8), depth=2, features=4)  # multiple (1, 4, 4)
    image = np.zeros((64, 256, 256), np.uint8)
    config = FinetuneConfig(voxel_size=(40, 8, 8))
    assert Finetuner.fitted_config(model, image, config).patch_shape == (17, 88, 88)
