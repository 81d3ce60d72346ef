"""The committed sample checkpoint: loads safely, names its channels, is small and good."""

import numpy as np
import torch

from napari_finetune.data.normalization import intensity_range, normalize
from napari_finetune.model.checkpoint import load_checkpoint
from napari_finetune.samples.synthetic_em import (
    CHANNEL_NAMES,
    generate_volume,
    sample_checkpoint_path,
)


def test_checkpoint_is_committed_small_and_loads_with_its_channels():
    path = sample_checkpoint_path()
    assert path.is_file(), "run sample_data/train_sample_model.py"
    assert path.stat().st_size < 10 * 2**20
    ckpt = load_checkpoint(path)
    assert ckpt.channel_names == CHANNEL_NAMES
    assert ckpt.normalization == {"method": "percentile", "low": 1.0, "high": 99.0}
    assert ckpt.architecture["kwargs"]["out_channels"] == 2
    assert ckpt.architecture["kwargs"]["dims"] == 3
    assert "source" in ckpt.metadata["trained_on"]
    assert ckpt.metadata["training"]["steps"] > 0
    # weights_only loading is what load_checkpoint promises; check the raw file too.
    assert torch.load(path, weights_only=True)["format"] == "napari-finetune-checkpoint"


def _iou(prob, truth, label):
    pred, true = prob > 0.5, truth == label
    return np.logical_and(pred, true).sum() / np.logical_or(pred, true).sum()


def _predict(model, image, spec):
    x = normalize(image, *intensity_range(image, spec))
    with torch.no_grad():
        return torch.sigmoid(model(torch.from_numpy(x)[None, None]))[0].numpy()


def test_checkpoint_is_good_on_source_and_clearly_worse_on_target():
    """Not a stub: good on an unseen source volume; the demo's domain gap is real."""
    torch.set_num_threads(2)
    ckpt = load_checkpoint(sample_checkpoint_path())
    inner = (slice(8, -8),) * 3  # the outer voxels see padding: judge the interior
    scores = {}
    for domain in ("source", "target"):
        image, truth = generate_volume((32, 96, 96), 123, domain)
        prob = _predict(ckpt.model, image, ckpt.normalization)
        assert prob.shape == (2, *image.shape)
        scores[domain] = [_iou(prob[c][inner], truth[inner], c + 1) for c in range(2)]
    assert scores["source"][0] > 0.8 and scores["source"][1] > 0.7, scores
    assert scores["target"][0] < scores["source"][0] - 0.15, scores
