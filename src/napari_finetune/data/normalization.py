"""Intensity normalisation shared by training and prediction.

The checkpoint records *how* to normalise (``{"method": "percentile", "low": 1,
"high": 99}``); the numbers are computed per volume from a strided subsample,
so a zarr or dask volume is never read whole and a different acquisition's
offset and contrast are taken out before the model sees it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_SAMPLE_VOXELS = 2_000_000


def subsample(image: Any, max_voxels: int = MAX_SAMPLE_VOXELS) -> np.ndarray:
    """A strided view of ``image`` with at most about ``max_voxels`` voxels, as numpy."""
    shape = tuple(int(s) for s in image.shape)
    total = int(np.prod(shape))
    stride = max(1, int(np.ceil((total / max_voxels) ** (1 / len(shape)))))
    view = image[tuple(slice(None, None, stride) for _ in shape)]
    return np.asarray(view, dtype=np.float32)


def intensity_range(image: Any, spec: dict[str, Any]) -> tuple[float, float]:
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
        low, high = (float(v) for v in np.percentile(values, [spec["low"], spec["high"]]))
    else:
        raise ValueError(f"unknown normalization method {method!r}; use 'percentile' or 'fixed'.")
    if not high > low:
        high = low + 1.0  # a constant image: avoid dividing by zero
    return low, high


def normalize(block: np.ndarray, low: float, high: float) -> np.ndarray:
    """Scale ``block`` so that ``low`` -> 0 and ``high`` -> 1, as float32."""
    return ((np.asarray(block, dtype=np.float32) - low) / (high - low)).astype(np.float32)
