"""Intensity normalisation shared by training and prediction.

The checkpoint records *how* to normalise (``{"method": "percentile", "low": 1,
"high": 99}``); the numbers are computed per volume from a strided subsample,
so a zarr or dask volume is never read whole and a different acquisition's
offset and contrast are taken out before the model sees it.

Non-finite voxels (NaN, inf: float volumes often mark masked regions so) are
*missing*: the range is computed over the finite voxels only, the network
sees :data:`MISSING_VALUE` there, training leaves them out of the supervised
loss and prediction writes background there. :func:`describe_missing` gives
the one line that says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from napari_finetune.arrays import AxesImage, VolumeArray

MAX_SAMPLE_VOXELS = 2_000_000
# What the network sees at a missing voxel: the low end of the range (dark, empty).
MISSING_VALUE = 0.0
# Volumes up to this size are scanned whole for missing voxels; larger ones by subsample.
MAX_SCAN_VOXELS = 512 * 2**20
SCAN_SLAB_VOXELS = 16 * 2**20


def subsample(image: VolumeArray, max_voxels: int = MAX_SAMPLE_VOXELS) -> np.ndarray:
    """A strided view of ``image`` with at most about ``max_voxels`` voxels, as numpy."""
    shape = tuple(int(s) for s in image.shape)
    stride = subsample_stride(shape, max_voxels)
    view = image[tuple(slice(None, None, stride) for _ in shape)]
    return np.asarray(view, dtype=np.float32)


def subsample_stride(shape: tuple[int, ...], max_voxels: int = MAX_SAMPLE_VOXELS) -> int:
    """The step along every axis that :func:`subsample` takes."""
    total = int(np.prod(shape))
    return max(1, int(np.ceil((total / max_voxels) ** (1 / len(shape)))))


def intensity_range(image: VolumeArray, spec: dict[str, Any]) -> tuple[float, float]:
    """The (low, high) intensities that map to 0 and 1 under ``spec``.

    Parameters
    ----------
    image : array-like
        numpy, zarr or dask; only a subsample is read.
    spec : dict
        ``{"method": "percentile", "low": p_lo, "high": p_hi}`` or
        ``{"method": "fixed", "low": v_lo, "high": v_hi}``.
    """
    method = spec.get("method", "percentile")
    if method == "fixed":
        low, high = float(spec["low"]), float(spec["high"])
    elif method == "percentile":
        values = subsample(image)
        values = values[np.isfinite(values)]
        if values.size == 0:
            raise ValueError(
                "the image has no finite voxels in its subsample (all NaN or inf); "
                "check the volume, or give a fixed normalisation range."
            )
        low, high = (float(v) for v in np.percentile(values, [spec["low"], spec["high"]]))
    else:
        raise ValueError(f"unknown normalization method {method!r}; use 'percentile' or 'fixed'.")
    if not high > low:
        high = low + 1.0  # a constant image: avoid dividing by zero
    return low, high


def intensity_ranges(image: AxesImage, spec: dict[str, Any]) -> list[tuple[float, float]]:
    """:func:`intensity_range` of each channel of ``image`` (over all its time points).

    Channels differ in offset and contrast (a nuclear stain beside a membrane
    marker), so each is normalised on its own; a single-channel image gives one range.
    """
    if image.channels == 1 and "c" not in image.axes:
        return [intensity_range(image.array, spec)]
    return [intensity_range(image.channel(c).array, spec) for c in range(image.channels)]


def image_range(
    image: VolumeArray | AxesImage, spec: dict[str, Any]
) -> tuple[float, float] | list[tuple[float, float]]:
    """The range of a plain volume or of one channel (over its time points), or each
    channel's range (:func:`intensity_ranges`): what prediction normalises with."""
    if not isinstance(image, AxesImage):
        return intensity_range(image, spec)
    return intensity_ranges(image, spec) if "c" in image.axes else intensity_range(
        image.array, spec)


def normalize_channels(block: np.ndarray, ranges: list[tuple[float, float]]) -> np.ndarray:
    """``(C, *spatial)`` raw values normalised channel by channel (:func:`normalize`)."""
    if len(ranges) != block.shape[0]:
        raise ValueError(f"{len(ranges)} normalisation ranges for {block.shape[0]} channels")
    return np.stack([normalize(channel, *r) for channel, r in zip(block, ranges, strict=True)])


def normalize(block: np.ndarray, low: float, high: float) -> np.ndarray:
    """Scale ``block`` so that ``low`` -> 0 and ``high`` -> 1, as float32.

    Non-finite voxels become :data:`MISSING_VALUE`.
    """
    out = ((np.asarray(block, dtype=np.float32) - low) / (high - low)).astype(np.float32)
    missing = missing_mask(block)
    if missing is not None:
        out[missing] = MISSING_VALUE
    return out


def missing_mask(block: np.ndarray) -> np.ndarray | None:
    """Boolean mask of the non-finite voxels of ``block``; None when there are none."""
    block = np.asarray(block)
    if not np.issubdtype(block.dtype, np.floating):
        return None  # integer images cannot hold NaN
    mask = ~np.isfinite(block)
    return mask if mask.any() else None


def background_where_missing(probs: np.ndarray, missing: np.ndarray | None) -> None:
    """Set ``probs`` (channels first) to 0, background, where ``missing`` (from
    :func:`missing_mask` of the same voxels) says the image had no value."""
    if missing is not None:
        probs[:, missing] = 0.0


def describe_missing(image: VolumeArray, axes: str = "zyx") -> str | None:
    """One line on the image's non-finite voxels, or None when it has none.

    Volumes up to :data:`MAX_SCAN_VOXELS` are scanned whole, slab by slab (bounded
    memory); larger ones through a strided subsample, and the line says so.

    Examples
    --------
    ``"the image has 5 NaN voxels, first at z=8 y=20 x=29: treated as missing
    (not trained on, predicted as background)"``
    """
    dtype = np.dtype(getattr(image, "dtype", np.float32))
    if not np.issubdtype(dtype, np.floating):
        return None
    shape = tuple(int(s) for s in image.shape)
    names = axes[-len(shape) :] if len(axes) >= len(shape) else "".join(f"a{i}" for i in shape)
    total = int(np.prod(shape))
    nan = inf = 0
    first: tuple[int, ...] | None = None
    if total <= MAX_SCAN_VOXELS:
        where, stride = "", 1
        rows = max(1, SCAN_SLAB_VOXELS // max(1, total // max(1, shape[0])))
        slabs: Iterator[tuple[int, np.ndarray]] = (
            (start, np.asarray(image[start : start + rows])) for start in range(0, shape[0], rows)
        )
    else:
        sample = subsample(image)
        stride = subsample_stride(shape)
        where = f" in a {sample.size:,}-voxel subsample"
        slabs = iter([(0, sample)])
    for start, slab in slabs:
        nan += int(np.count_nonzero(np.isnan(slab)))
        inf += int(np.count_nonzero(np.isinf(slab)))
        if first is None and (nan or inf):
            hit = np.argwhere(~np.isfinite(slab))[0]
            first = (start + int(hit[0]) * stride, *(int(h) * stride for h in hit[1:]))
    if first is None:
        return None
    counts = " and ".join(f"{n:,} {kind} voxels" for n, kind in ((nan, "NaN"), (inf, "inf")) if n)
    at = " ".join(f"{name}={v}" for name, v in zip(names, first, strict=True))
    return (
        f"the image has {counts}{where}, first at {at}: treated as missing "
        "(not trained on, predicted as background)"
    )
