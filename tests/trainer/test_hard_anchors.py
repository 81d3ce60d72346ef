"""Error-weighted anchors: the re-score weights the voxels the model gets wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_setup import make_trainer

from napari_finetune.trainer.hard_anchors import HARD_FLOOR, anchor_wrongness, rescore


def test_anchor_wrongness_by_hand():
    probs = np.array([[0.9, 0.2], [0.3, 0.6]])
    both = np.array([True, True])
    # Painted channel 0 (label 2): |0.9 - 1| and |0.2 - 0| -> 0.2; |0.3 - 1| -> 0.7.
    assert anchor_wrongness(probs, 2, both) == pytest.approx([0.2, 0.7])
    # Painted background: the largest probability of a corrected channel.
    assert anchor_wrongness(probs, 1, both) == pytest.approx([0.9, 0.6])
    # Channel 1 not corrected: not judged.
    assert anchor_wrongness(probs, 1, np.array([True, False])) == pytest.approx([0.9, 0.3])


class Constant(torch.nn.Module):
    """Says "channel 0" everywhere: right on its strokes, wrong on the background."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.tensor([8.0, -8.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias.view(1, 2, 1, 1, 1) + 0 * x


def test_rescore_weights_the_wrong_anchors_and_sets_them_on_the_sampler():
    trainer = make_trainer(steps=1, batch_size=4, model=Constant(), hold_other_channels=False)
    trainer.build()
    weights = rescore(trainer)
    # Background strokes are all wrong (p = 1 for channel 0), channel-0 strokes all right.
    assert weights[1] == pytest.approx(HARD_FLOOR + 1.0, abs=1e-3)
    assert weights[2] == pytest.approx(HARD_FLOOR, abs=1e-3)
    assert trainer.sampler.anchor_cdf is not None
