"""Output regions aligned to the output chunks, and out-of-memory step-down within them.

Predicting into a zarr store, each region is one output chunk (its core) read
with a halo: regions start at multiples of the block shape, so a region writes
whole chunks that no other region touches. :class:`RegionPredictor` computes a
region in one model call, or, after running out of memory, as tiles of a
smaller block: the block shrinks step by step (largest axes halved, never below
the model's pooling multiple), one log line per step, and the smaller block is
kept for the regions that follow.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from napari_finetune.arrays import AxesImage, VolumeArray
from napari_finetune.data.normalization import (
    background_where_missing,
    missing_mask,
    normalize,
    normalize_channels,
)
from napari_finetune.devices import empty_device_cache

# The tiling lives in predict.tiling; these names stay importable from here.
from napari_finetune.predict.tiling import read_span, region_grid
from napari_finetune.predict.tiling import smaller_block as smaller_block
from napari_finetune.predict.volume import predict_batch, spatial_multiple

Log = Callable[[str], None]

if TYPE_CHECKING:  # torch is imported when a model runs
    import torch


class PredictOutOfMemoryError(MemoryError):
    """Out of memory even at the smallest block; the message says what was tried."""


def _fmt(shape: Sequence[int]) -> str:
    return "x".join(str(int(s)) for s in shape)


class RegionPredictor:
    """Probabilities of one core region at a time, stepping down on OOM.

    Parameters
    ----------
    model : torch.nn.Module
        Already on ``device``.
    image : array-like or AxesImage
        The whole volume; only core + halo is read per tile. An image with
        channels (one time point) is read with all of them.
    low, high : float
        Normalisation range (of a single-channel image).
    halo : tuple of int
        Context on each side, trimmed from the output.
    device : str
        Where the model runs.
    log : callable, optional
        Receives one line per step down.
    ranges : list of (float, float), optional
        One normalisation range per channel of an image with channels.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        image: VolumeArray | AxesImage,
        low: float,
        high: float,
        halo: Sequence[int],
        device: str,
        log: Log | None = None,
        ranges: list[tuple[float, float]] | None = None,
    ) -> None:
        axes_image = AxesImage.of(image)
        if axes_image.has_time:
            raise ValueError("predict one time point at a time (AxesImage.at_time)")
        # A plain volume takes the path it always took; channels go through read().
        self.channels = None if axes_image.is_plain else axes_image
        self.ranges = ranges or [(low, high)]
        self.model, self.image, self.low, self.high = model, axes_image.array, low, high
        self.halo = tuple(int(h) for h in halo)
        self.device = device
        self.log = log or (lambda _line: None)
        self.shape = axes_image.spatial_shape
        self.multiple = spatial_multiple(model, len(self.shape))
        self.block: tuple[int, ...] | None = None  # None: a whole region per call

    def _tiles(self, core: tuple[slice, ...], block: Sequence[int]) -> np.ndarray:
        sizes = [c.stop - c.start for c in core]
        out: np.ndarray | None = None
        starts = [c.start for c in core]
        stops = [c.stop for c in core]
        for tile in region_grid(self.shape, block, starts, stops):
            spans = [
                read_span(t.start, t.stop, s, h, m)
                for t, s, h, m in zip(tile, self.shape, self.halo, self.multiple, strict=True)
            ]
            read = tuple(r for r, _ in spans)
            inner = tuple(i for _, i in spans)
            if self.channels is None:
                raw = np.asarray(self.image[read])
                probs = predict_batch(self.model, normalize(raw, self.low, self.high)[None],
                                      self.device)[0]
                missing = missing_mask(raw[inner])
            else:
                raw = self.channels.read(read)
                probs = predict_batch(self.model, normalize_channels(raw, self.ranges)[None],
                                      self.device, channels=True)[0]
                per_channel = missing_mask(raw[(slice(None),) + inner])
                missing = None if per_channel is None else np.asarray(per_channel.any(axis=0))
            background_where_missing(probs[(slice(None),) + inner], missing)
            if out is None:
                out = np.empty((probs.shape[0], *sizes), np.float32)
            where = tuple(
                slice(t.start - c.start, t.stop - c.start) for t, c in zip(tile, core, strict=True)
            )
            out[(slice(None),) + where] = probs[(slice(None),) + inner]
        assert out is not None
        return out

    def __call__(self, core: tuple[slice, ...]) -> np.ndarray:
        """``(C, *core sizes)`` probabilities of the region ``core``."""
        while True:
            block = self.block or tuple(c.stop - c.start for c in core)
            failed = False
            try:
                return self._tiles(core, block)
            except Exception as exc:  # noqa: BLE001 - only OOM is handled, the rest re-raised
                from napari_finetune.errors import is_oom_error

                if not is_oom_error(exc):
                    raise
                failed = True
            if failed:  # outside the except: its traceback holds the failed tensors
                self._free()
                smaller = smaller_block(block, self.multiple)
                if smaller is None:
                    raise PredictOutOfMemoryError(
                        f"out of memory on {self.device} even at the smallest block "
                        f"{_fmt(block)} (halo {_fmt(self.halo)}); use a smaller halo or "
                        "a device with more memory."
                    )
                self.log(
                    f"out of memory on blocks of {_fmt(block)}: stepping down to {_fmt(smaller)}"
                )
                self.block = smaller

    def _free(self) -> None:
        gc.collect()
        empty_device_cache(self.device)
