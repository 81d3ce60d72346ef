"""Tiny, deterministic fine-tuning set-ups (CPU, a few seconds each).

Imported by the tests of this folder as ``from engine_setup import ...``.
"""

from __future__ import annotations

import numpy as np

from napari_finetune.config import FinetuneConfig
from napari_finetune.model.unet import UNet
from napari_finetune.trainer.loop import Finetuner

PATCH = (4, 8, 8)


def volume(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A 16x32x32 noisy volume with background and channel-0 strokes."""
    rng = np.random.default_rng(seed)
    image = rng.normal(100.0, 10.0, size=(16, 32, 32)).astype(np.float32)
    image[8:12, 20:25, 20:25] += 40.0
    corrections = np.zeros(image.shape, np.uint8)
    corrections[4:8, 5:10, 5:10] = 1
    corrections[8:12, 20:25, 20:25] = 2
    return image, corrections


def make_trainer(
    norm: str = "group", dims: int = 3, model=None, metadata=None, sync=None, **overrides
) -> Finetuner:
    """A Finetuner on a depth-2, 4-feature UNet; ``overrides`` go to FinetuneConfig."""
    import torch

    torch.manual_seed(0)
    if model is None:
        model = UNet(dims=dims, in_channels=1, out_channels=2, depth=2, features=4, norm=norm)
    image, corrections = volume()
    if dims == 2:
        image, corrections = image[10], corrections[10]
    settings = dict(
        steps=3,
        batch_size=8,
        accumulation=1,
        patch_shape=PATCH if dims == 3 else (16, 16),
        learning_rate=1e-3,
        mode="full",
        distillation=0.5,
        hold_other_channels=True,
        mixed_precision=False,
        device="cpu",
        seed=0,
        # The loop's own tests count forward passes and samples exactly; the
        # held-out validation has tests of its own (test_validation.py).
        validation_fraction=0.0,
    )
    settings.update(overrides)
    config = FinetuneConfig(**settings)
    return Finetuner(model, image, corrections, config, metadata=metadata, sync=sync)


def count_calls(optimizer) -> list[int]:
    """Wrap ``optimizer.step`` to count the calls that really stepped."""
    calls = [0]
    original = optimizer.step

    def step(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    optimizer.step = step
    return calls
