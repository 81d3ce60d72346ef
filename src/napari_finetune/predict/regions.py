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

from napari_finetune.arrays import VolumeArray
from napari_finetune.data.normalization import (
    background_where_missing,
    missing_mask,
    normalize,
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
    image : array-like
        The whole volume; only core + halo is read per tile.
    low, high : float
        Normalisation range.
    halo : tuple of int
        Context on each side, trimmed from the output.
    device : str
        Where the model runs.
    log : callable, optional
        Receives one line per step down.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        image: VolumeArray,
        low: float,
        high: float,
        halo: Sequence[int],
        device: str,
        log: Log | None = None,
    ) -> None:
        self.model, self.image, self.low, self.high = model, image, low, high
        self.halo = tuple(int(h) for h in halo)
        self.device = device
        self.log = log or (lambda _line: None)
        self.shape = tuple(int(s) for s in image.shape)
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
            raw = np.asarray(self.image[read])
            probs = predict_batch(self.model, normalize(raw, self.low, self.high)[None],
                                  self.device)[0]
            background_where_missing(probs[(slice(None),) + inner], missing_mask(raw[inner]))
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
