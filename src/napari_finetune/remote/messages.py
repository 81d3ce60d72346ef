"""What travels between the client and the worker of a remote run, as plain data.

Statuses go as dicts of plain types (the worker's :class:`Status`, field by
field); weights as ``torch.save`` bytes of a state dict, read back with
``torch.load(weights_only=True)`` like any checkpoint, so nothing the worker
sends can run code here.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from typing import Any

from napari_finetune.config import FinetuneConfig
from napari_finetune.remote.tiles import ImageTiles, Painting, StoredImage
from napari_finetune.trainer.status import Status

# Message kinds on the run's queue, worker -> client.
STARTED, STATUS, WEIGHTS, FAILED, DONE, LOST = (
    "started", "status", "weights", "failed", "done", "lost"
)
BEST = "best"  # the best validation weights so far, their step and score
PREVIEW = "preview"  # probabilities of a region the client asked for, after a step


def status_to_plain(status: Status) -> dict[str, Any]:
    """``status`` as a dict of plain types."""
    return dataclasses.asdict(status)


def status_from_plain(plain: dict[str, Any]) -> Status:
    """The :class:`Status` a worker sent."""
    return Status(**plain)


def weights_to_bytes(state_dict: dict[str, Any]) -> bytes:
    """A state dict as ``torch.save`` bytes (tensors moved to the CPU)."""
    import torch

    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, buffer)
    return buffer.getvalue()


def weights_from_bytes(data: bytes) -> dict[str, Any]:
    """A state dict from :func:`weights_to_bytes`'s bytes, read with ``weights_only=True``."""
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def region_to_plain(region: tuple[slice, ...]) -> list[list[int]]:
    """A box of unit-step slices as ``[[start, stop], ...]``."""
    return [[int(r.start), int(r.stop)] for r in region]


def region_from_plain(plain: list[list[int]]) -> tuple[slice, ...]:
    """The box :func:`region_to_plain` wrote."""
    return tuple(slice(start, stop) for start, stop in plain)


@dataclass(frozen=True)
class RunInputs:
    """Everything one remote run needs, sent with its task.

    Attributes
    ----------
    run_id : str
        Names the run's queue and events on the scheduler.
    checkpoint : bytes
        The starting checkpoint file's bytes; ``suffix`` is its file suffix.
    trust : tuple of str
        The factories the user trusts (as for a local load).
    config : FinetuneConfig
        The run's settings, the patch already fitted on the client.
    normalization_range : (float, float)
        The image's intensity range, measured on the whole volume on the client.
    painting : Painting
        The painted voxels.
    image : ImageTiles or StoredImage
        The image tiles the patches can reach, or the store path the worker
        reads the image from itself (checked there before the run is sent).
    weights_every : int
        Send the weights back every this many steps (and at the end, always).
    """

    run_id: str
    checkpoint: bytes
    suffix: str
    trust: tuple[str, ...]
    config: FinetuneConfig
    normalization_range: tuple[float, float]
    painting: Painting
    image: ImageTiles | StoredImage
    weights_every: int = 5

    @property
    def nbytes(self) -> int:
        """Bytes of the payload (checkpoint, painting, image tiles or none)."""
        return len(self.checkpoint) + self.painting.nbytes + self.image.nbytes

    def queue_name(self) -> str:
        """The run's message queue, worker -> client."""
        return f"napari-finetune-{self.run_id}-messages"

    def stop_name(self) -> str:
        """The run's Stop event, client -> worker."""
        return f"napari-finetune-{self.run_id}-stop"

    def preview_name(self) -> str:
        """The run's preview requests, client -> worker."""
        return f"napari-finetune-{self.run_id}-previews"

    def started_name(self) -> str:
        """Set by the task when it starts: a second start is a retry after a lost worker."""
        return f"napari-finetune-{self.run_id}-started"
