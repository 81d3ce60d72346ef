"""Voxel size: the physical size of a voxel along each spatial axis, and what it changes.

A volume's voxel size comes from its NGFF scale (or ``--voxel-size``) and is
``None`` when unknown. Only its *shape* matters to the patch, the pooling and
the objects' distances: an isotropic voxel size, whatever its unit, changes
nothing, and an anisotropic one (CREMI ssTEM: 40 nm in z, 4 nm in xy) makes
the patch and the pooling about isotropic in physical units and measures the
objects' distances in units of the finest axis's voxel. Plain Python, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

VoxelSize = tuple[float, ...]

# Axes whose sizes differ by at most this share are "the same": a voxel size
# within it is isotropic (patch and pooling as without one), and a volume whose
# voxel size differs by more from the one a model was trained at gets a warning.
TOLERANCE = 0.1


def check_voxel_size(value: Sequence[float] | None, name: str = "voxel_size") -> VoxelSize | None:
    """``value`` as a tuple of floats, or None; a one-line ValueError for a bad one."""
    if value is None:
        return None
    try:
        sizes = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be numbers, one per spatial axis (Z, Y, X), got {value!r}; "
            "e.g. (40, 8, 8) for 40 nm sections of 8 nm pixels."
        ) from None
    if not 2 <= len(sizes) <= 3 or not all(math.isfinite(s) and s > 0 for s in sizes):
        raise ValueError(
            f"{name} must be 2 or 3 positive numbers (Y, X or Z, Y, X), got {value!r}; "
            "e.g. (40, 8, 8) for 40 nm sections of 8 nm pixels."
        )
    return sizes


def parse_voxel_size(text: str) -> VoxelSize:
    """``"40,8,8"`` -> ``(40.0, 8.0, 8.0)`` (the CLI's ``--voxel-size Z,Y,X``)."""
    parts = [p for p in text.replace("x", ",").split(",") if p.strip()]
    try:
        sizes = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(
            f"voxel size must be numbers such as 40,8,8 (Z,Y,X), got {text!r}."
        ) from None
    checked = check_voxel_size(sizes)
    assert checked is not None
    return checked


def for_axes(voxel_size: Sequence[float] | None, ndim: int) -> VoxelSize | None:
    """The last ``ndim`` sizes (a 2D image of a ZYX voxel size keeps Y, X); None stays None."""
    if voxel_size is None or len(voxel_size) < ndim:
        return None
    return tuple(float(v) for v in voxel_size)[len(voxel_size) - ndim:]


def is_anisotropic(voxel_size: Sequence[float] | None) -> bool:
    """Whether the coarsest axis is more than :data:`TOLERANCE` coarser than the finest."""
    if not voxel_size:
        return False
    return max(voxel_size) > (1 + TOLERANCE) * min(voxel_size)


# Sections at least this many times thicker than their finest pixel are "thick": a
# membrane tilted through one moves more than its own width to the next, so cells are
# made section by section and linked across z (napari_finetune.objects.boundary_instances).
THICK_SECTIONS = 4.0


def thick_sections(voxel_size: Sequence[float] | None, ndim: int) -> bool:
    """Whether a (Z, Y, X) volume's z voxel is at least :data:`THICK_SECTIONS` times its
    finest in-plane (Y, X) voxel; False for a 2D image and for an unknown voxel size."""
    sizes = for_axes(voxel_size, ndim)
    if ndim != 3 or sizes is None:
        return False
    return sizes[0] >= THICK_SECTIONS * min(sizes[1:])


def sampling(voxel_size: Sequence[float] | None, ndim: int) -> VoxelSize | None:
    """Voxel size relative to the finest axis, for scipy's ``sampling=``; None if isotropic.

    Relative, so that distances stay in voxels of the finest axis: a role's
    ``seed_distance`` of 4 means 4 xy voxels on a (40, 8, 8) nm volume, as it
    means 4 voxels on an isotropic one, whose results do not change.
    """
    sizes = for_axes(voxel_size, ndim)
    if sizes is None or not is_anisotropic(sizes):
        return None
    finest = min(sizes)
    return tuple(s / finest for s in sizes)


def pooling_factors(voxel_size: Sequence[float] | None, depth: int, ndim: int) -> list[list[int]]:
    """Per level, the 2x pooling of each axis: an axis is pooled once it is about the finest.

    An axis more than 1.5 times coarser than the finest is not pooled at that
    level (z of a (40, 8, 8) nm volume: (1, 2, 2) twice, then (2, 2, 2)), so the
    network's receptive field grows towards isotropic in physical units.
    """
    current = list(for_axes(voxel_size, ndim) or (1.0,) * ndim)
    factors = []
    for _ in range(depth):
        finest = min(current)
        level = [2 if size < 1.5 * finest else 1 for size in current]
        current = [size * f for size, f in zip(current, level, strict=True)]
        factors.append(level)
    return factors


def differs(trained: Sequence[float] | None, volume: Sequence[float] | None) -> bool:
    """Whether two known voxel sizes differ by more than :data:`TOLERANCE` on some axis."""
    if trained is None or volume is None:
        return False
    ndim = min(len(trained), len(volume))
    a, b = for_axes(trained, ndim), for_axes(volume, ndim)
    assert a is not None and b is not None
    return any(abs(x - y) > TOLERANCE * max(x, y) for x, y in zip(a, b, strict=True))


def mismatch_line(trained: Sequence[float] | None, volume: Sequence[float] | None) -> str | None:
    """One warning line when ``volume``'s voxel size differs from the one trained at, else None."""
    if not differs(trained, volume):
        return None
    assert trained is not None and volume is not None
    return (
        f"warning: this model was trained at voxel size {fmt(trained)} but the volume's is "
        f"{fmt(volume)}; structures look {'larger' if min(volume) < min(trained) else 'smaller'}"
        " to it than in training, so expect worse predictions (rescale the volume, or "
        "fine-tune on it)."
    )


def fmt(voxel_size: Sequence[float]) -> str:
    """``(40, 8, 8)`` -> ``"40 x 8 x 8"``."""
    return " x ".join(f"{v:g}" for v in voxel_size)


def trained_voxel_size(metadata: Mapping[str, object]) -> VoxelSize | None:
    """The voxel size a checkpoint's model was last fine-tuned at (its run record), or None.

    The run record's ``config`` holds the run's :class:`~napari_finetune.config.FinetuneConfig`,
    ``voxel_size`` included; a run at an unknown voxel size leaves the previous run's.
    """
    run = metadata.get("run")
    while isinstance(run, Mapping):
        config = run.get("config")
        value = config.get("voxel_size") if isinstance(config, Mapping) else None
        if isinstance(value, (list, tuple)):
            try:
                return check_voxel_size(value)
            except ValueError:
                return None
        run = run.get("previous_run")
    try:  # a checkpoint written with its voxel size beside the runs' records
        return check_voxel_size(metadata.get("voxel_size"))  # type: ignore[arg-type]
    except ValueError:
        return None
