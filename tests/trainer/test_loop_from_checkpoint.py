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
