"""The engine runs where napari, Qt, zarr and dask are not installed (a GPU server, a
cluster worker): it imports and trains with torch, numpy, scipy, tqdm and peft alone.

A subprocess blocks the front ends' packages at import time, then imports the engine's
modules and does the engine's whole job on a tiny volume: generate the sample, fine-tune
(LoRA), export, load, predict blockwise, open the sample checkpoint.
"""

from __future__ import annotations

from import_blocker import run_without

BLOCKED = [
    "napari", "npe2", "app_model", "vispy", "qtpy", "PyQt5", "PyQt6", "PySide2", "PySide6",
    "magicgui", "superqt", "psygnal", "zarr", "ome_zarr", "ome_zarr_models", "dask",
    "distributed", "bioimageio",
]

ENGINE = [
    "napari_finetune.config",
    "napari_finetune.trainer.loop",
    "napari_finetune.trainer.recovery",
    "napari_finetune.model.checkpoint",
    "napari_finetune.model.unet",
    "napari_finetune.data.sampling",
    "napari_finetune.predict",
    "napari_finetune.samples.synthetic_em",
    "napari_finetune.testing",
]

BODY = """
import importlib
import os
import tempfile

for module in {engine!r}:
    importlib.import_module(module)

import numpy as np

from napari_finetune.config import FinetuneConfig, PredictConfig
from napari_finetune.model.checkpoint import load_checkpoint
from napari_finetune.model.unet import UNet
from napari_finetune.predict import predict_volume
from napari_finetune.samples.synthetic_em import generate_volume, sample_checkpoint_path
from napari_finetune.trainer.loop import Finetuner

image, truth = generate_volume((16, 32, 32), 0)
corrections = np.zeros(image.shape, np.uint8)
corrections[4] = truth[4] + 1
# LoRA reaches peft too; a full run imports nothing more.
config = FinetuneConfig(steps=1, batch_size=2, patch_shape=(8, 16, 16), mode="lora",
                        device="cpu", validation_fraction=0.0)
trainer = Finetuner(UNet(dims=3, depth=2, features=4), image, corrections, config)
kinds = [status.kind for status in trainer.run()]
assert kinds[-1] == "finished", kinds
path = trainer.export(os.path.join(tempfile.mkdtemp(), "model.pt"))
model = load_checkpoint(path).model
probs = predict_volume(model, image, (float(image.min()), float(image.max())),
                       PredictConfig(device="cpu"))
assert probs.shape == (2, 16, 32, 32)
load_checkpoint(sample_checkpoint_path())
"""


def test_the_engine_needs_no_napari_qt_zarr_or_dask():
    run_without(BLOCKED, BODY.format(engine=ENGINE))
