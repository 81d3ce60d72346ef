"""A fine-tune of a few steps on a loaded checkpoint, for the tests of what an export keeps."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from napari_finetune.config import FinetuneConfig
from napari_finetune.model.checkpoint import Checkpoint
from napari_finetune.trainer.loop import Finetuner


def finetune_briefly(ckpt: Checkpoint, image: np.ndarray, out: Path) -> Path:
    """Two steps of a full fine-tune on strokes of both channels; the export's path."""
    corrections = np.zeros(image.shape, np.uint8)
    corrections[2, 4:12, 4:12] = 1
    corrections[4, 20:26, 20:26] = 2
    corrections[6, 30:34, 8:14] = 3
    config = FinetuneConfig(steps=2, batch_size=2, patch_shape=(4, 16, 16), device="cpu",
                            validation_fraction=0.0)
    trainer = Finetuner(ckpt.model, image, corrections, config, metadata=ckpt.metadata,
                        source_sha256=ckpt.sha256)
    for _ in trainer.run():
        pass
    return Path(trainer.export(out))
