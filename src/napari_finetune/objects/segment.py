"""Instance labels from one channel's probability, in memory.

Both functions return uint32 labels, ids 1..N consecutive, 0 where there is no
instance. They are deterministic and single-threaded (scipy.ndimage and
scikit-image), so a block of a larger volume gives the same labels wherever it
is computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy import ndimage
from skimage.segmentation import watershed

from napari_finetune.objects.roles import ChannelRole

# Largest id a uint32 label array holds (a module constant so a test can lower it).
MAX_ID = int(np.iinfo(np.uint32).max)


def _probability(prob: np.ndarray, params: ChannelRole, role: str) -> np.ndarray:
    params.validate()
    if params.role not in (None, role):
        raise ValueError(f"this channel's role is {params.role!r}; use the {params.role} function.")
    prob = np.asarray(prob)
    if prob.ndim not in (2, 3) or prob.size == 0:
        raise ValueError(
            f"expected one channel's (Y, X) or (Z, Y, X) probability, got shape {prob.shape}."
        )
    return prob.astype(np.float32, copy=False)


def _check_count(n: int, what: str) -> None:
    if n > MAX_ID:
        raise ValueError(
            f"{n} {what} would overflow uint32 labels; raise min_size/seed_distance or "
            "process the volume in blocks."
        )


def _label(mask: np.ndarray, what: str) -> tuple[np.ndarray, int]:
    # int64 only where int32 could not count every component (a checkerboard has size/2).
    out = np.int64 if mask.size // 2 + 1 > np.iinfo(np.int32).max else np.int32
    labels, n = ndimage.label(mask, output=out)
    _check_count(int(n), what)
    return labels, int(n)


def _keep_big(labels: np.ndarray, min_size: int) -> np.ndarray:
    """Labels with instances under ``min_size`` voxels set to 0, renumbered 1..N as uint32."""
    sizes = np.bincount(labels.ravel())
    keep = sizes >= max(min_size, 1)
    keep[0] = False
    lut = np.zeros(sizes.size, np.uint32)
    lut[keep] = np.arange(1, int(keep.sum()) + 1, dtype=np.uint32)
    return lut[labels]


def _flood(
    surface: np.ndarray, markers: np.ndarray, n_markers: int, regions: np.ndarray, n_regions: int
) -> np.ndarray:
    """Markers grown over ``surface`` within each connected region of ``regions``.

    A region holding one marker is that marker's, whole: no flooding needed (the
    common case: most regions are one cell or one object), which is what makes
    this fast. Only regions with two or more markers are flooded, each in its
    bounding box. A region without a marker keeps an id of its own (a small one
    goes with ``min_size``).
    """
    inside = markers > 0
    region_of_marker = np.zeros(n_markers + 1, np.int64)
    region_of_marker[markers[inside]] = regions[inside]
    per_region = np.bincount(region_of_marker[1:], minlength=n_regions + 1)
    # Regions with no marker get new ids after the markers'.
    lut = np.zeros(n_regions + 1, np.int64)
    lut[region_of_marker[1:]] = np.arange(1, n_markers + 1)
    lonely = np.flatnonzero(per_region == 0)
    lonely = lonely[lonely > 0]  # region 0 is the background, not a region
    lut[lonely] = np.arange(n_markers + 1, n_markers + 1 + lonely.size)
    _check_count(n_markers + lonely.size, "instances")
    out = lut[regions]
    # Regions with several markers: lut gave them one of them; flood instead.
    boxes = ndimage.find_objects(regions)
    for region in np.flatnonzero(per_region >= 2):
        box = boxes[region - 1]
        mask = regions[box] == region
        grown = watershed(surface[box], markers[box] * mask, mask=mask)
        out[box][mask] = grown[mask]
    return out


def boundary_instances(prob: np.ndarray, params: ChannelRole | None = None) -> np.ndarray:
    """Regions enclosed by a boundary channel (cells between membranes).

    Interior is ``prob < threshold``. Seeds are the connected pieces of interior
    at least ``seed_distance`` voxels from the boundary, so a gap in a predicted
    membrane narrower than twice that does not merge two cells. Seeds grow over
    ``prob`` (a watershed) within the interior; the boundary stays 0.

    Parameters
    ----------
    prob : (Z, Y, X) or (Y, X) array
        Probability of the boundary channel.
    params : ChannelRole, optional
        Threshold, seed_distance, min_size; default ``ChannelRole("boundary")``.

    Returns
    -------
    np.ndarray of uint32
        Ids 1..N, 0 on the boundary and on removed fragments.
    """
    params = params or ChannelRole("boundary")
    prob = _probability(prob, params, "boundary")
    interior = prob < params.threshold
    regions, n_regions = _label(interior, "interior regions")
    depth = ndimage.distance_transform_edt(interior)
    markers, n_markers = _label(depth >= params.seed_distance, "seeds")
    labels = _flood(prob, markers, n_markers, regions, n_regions)
    return _keep_big(labels, params.min_size)


def object_instances(prob: np.ndarray, params: ChannelRole | None = None) -> np.ndarray:
    """Objects of an object channel (mitochondria): connected foreground, optionally split.

    Foreground is ``prob > threshold``; each connected component is an object.
    With ``split``, touching objects are cut by a watershed of the distance to
    the background, seeded at its maxima at least ``seed_distance`` apart.

    Parameters
    ----------
    prob : (Z, Y, X) or (Y, X) array
        Probability of the object channel.
    params : ChannelRole, optional
        Threshold, min_size, split, seed_distance; default ``ChannelRole("object")``.

    Returns
    -------
    np.ndarray of uint32
        Ids 1..N, 0 on background and on removed fragments.
    """
    params = params or ChannelRole("object")
    prob = _probability(prob, params, "object")
    foreground = prob > params.threshold
    regions, n_regions = _label(foreground, "objects")
    if params.split and n_regions:
        depth = ndimage.distance_transform_edt(foreground).astype(np.float32)
        size = 2 * int(params.seed_distance) + 1
        peaks = foreground & (depth == ndimage.maximum_filter(depth, size=size))
        # A plateau of equal maxima is one seed (label joins it), not many.
        markers, n_markers = _label(peaks, "seeds")
        labels = _flood(-depth, markers, n_markers, regions, n_regions)
    else:
        labels = regions
    return _keep_big(labels, params.min_size)


def instances_of(
    probabilities: np.ndarray,
    roles: Mapping[str, ChannelRole],
    channel_names: Sequence[str],
) -> dict[str, np.ndarray]:
    """Instance labels of every channel with a role, by channel name.

    Parameters
    ----------
    probabilities : (C, Z, Y, X) or (C, Y, X) array
    roles : channel name -> ChannelRole
        (:func:`napari_finetune.objects.roles_from_metadata`).
    channel_names : the C names, in channel order.
    """
    if len(channel_names) != len(probabilities):
        raise ValueError(
            f"{len(probabilities)} probability channels but {len(channel_names)} channel names."
        )
    out: dict[str, np.ndarray] = {}
    for name, prob in zip(channel_names, probabilities, strict=True):
        role = roles.get(name)
        if role is None or role.role is None:
            continue
        make = boundary_instances if role.role == "boundary" else object_instances
        out[name] = make(prob, role)
    return out
