"""Whether the starting model agrees with the painting enough for distillation to help.

Distillation holds the model, on the voxels nobody painted, to what the starting model
predicted there: it keeps what that model knew while the painting corrects a few
places. Across a large shift (a model trained on EM asked for fluorescent nuclei) the
starting model is wrong nearly everywhere, and holding the model to it holds it to
the errors the painting corrects. Measured on real volumes (``benchmarks/
bench_adapt_real.py``): the sample model agreed with 34 to 38 % of the painted voxels
of three light-sheet nuclei volumes (0 % of the nuclei) and with 69 % of the sample's
own painting, which paints the model's errors first; with distillation off the nuclei
IoU rose from 0.45-0.68 to 0.55-0.84 after 30 steps, while on the sample distillation
off lowered the held-out IoU. Below :data:`AGREEMENT_FLOOR` the run therefore
trains without distillation and says so in one line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from napari_finetune.data.sampling import PatchSampler
from napari_finetune.model.modes import evaluating

# Share of the painted voxels the starting model must get right for distillation to
# stay on: between the real nuclei volumes' 0.34-0.38 and the sample's 0.69.
AGREEMENT_FLOOR = 0.5
# Patches the agreement is measured on (one forward pass each, before step 1).
PATCHES = 4


@dataclass(frozen=True)
class Agreement:
    """The starting model on the painted voxels of a few training patches.

    Attributes
    ----------
    agreed : int
        Painted voxels it predicts as painted: background below 0.5 on every
        channel, a channel's label above 0.5 on that channel.
    painted : int
        Painted voxels measured (0: nothing painted in the patches drawn).
    """

    agreed: int
    painted: int

    @property
    def share(self) -> float:
        """``agreed / painted`` (1.0 without painted voxels: nothing contradicts it)."""
        return self.agreed / self.painted if self.painted else 1.0

    @property
    def keeps_distillation(self) -> bool:
        """Whether the share reaches :data:`AGREEMENT_FLOOR`."""
        return self.share >= AGREEMENT_FLOOR

    def describe(self) -> str:
        """One line for the log: what was measured and what it means for the run."""
        said = (f"the starting model agrees with {100 * self.share:.0f} % of the painted "
                f"voxels ({self.agreed} of {self.painted})")
        if self.keeps_distillation:
            return said
        return (f"{said}: distillation off, it would hold the model to the predictions "
                f"the painting corrects (at least {100 * AGREEMENT_FLOOR:.0f} % keeps it)")


def painted_agreement(
    model: nn.Module, sampler: PatchSampler, device: torch.device, patches: int = PATCHES
) -> Agreement:
    """How much of the painting the model gets right, on ``patches`` training patches.

    The sampler's random state is put back after drawing them, so the run draws the
    same patches as without the measurement; the model's train/eval flags too, so its
    BatchNorm statistics are untouched. One patch at a time: this runs before the
    batch size is known to fit.
    """
    state = sampler.get_state()
    try:
        images, labels = sampler.sample(patches)
    finally:
        sampler.set_state(state)
    agreed = painted = 0
    with evaluating(model), torch.no_grad():
        for image, label in zip(images, labels, strict=True):
            x = torch.from_numpy(np.ascontiguousarray(image[None])).to(device)
            probs = torch.sigmoid(model(x).float())[0].cpu().numpy()
            agreed_here, painted_here = _agreed(probs, label)
            agreed, painted = agreed + agreed_here, painted + painted_here
    return Agreement(agreed, painted)


def _agreed(probs: np.ndarray, label: np.ndarray) -> tuple[int, int]:
    """Painted voxels of one patch the ``(C, *patch)`` probabilities get right, and all
    painted voxels (labels: 0 unpainted, 1 background, ``k >= 2`` channel ``k - 2``;
    a label beyond the model's channels counts as painted and not agreed)."""
    above = probs > 0.5
    background = label == 1
    agreed = int((~above.any(axis=0) & background).sum())
    for channel in range(probs.shape[0]):
        agreed += int((above[channel] & (label == channel + 2)).sum())
    return agreed, int((label > 0).sum())
