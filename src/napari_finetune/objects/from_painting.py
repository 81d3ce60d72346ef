"""Object parameters that follow the structure: seed distance and min size from the painting.

The roles' parameters (:class:`~napari_finetune.objects.roles.ChannelRole`) are the
sample's, sized for mitochondria: nuclei 30 voxels across get split, cells merged.
The objects a user painted for a channel (its label, ``k >= 2`` for channel ``k - 2``,
in the corrections) say how large that channel's objects are; here they give the
channel's ``seed_distance`` and ``min_size``, unless the user set them. Few painted
objects (strokes only, fewer than :data:`MIN_OBJECTS`) keep the values as they are.

Pure numpy and scipy.ndimage; distances are in voxels of the finest axis, as the
objects step measures them (:func:`napari_finetune.voxel_size.sampling`), sizes in voxels.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import ndimage

from napari_finetune.objects.roles import ChannelRole
from napari_finetune.voxel_size import sampling as relative_sampling

# The parameters estimated here, and the sources a value can have.
ESTIMATED = ("seed_distance", "min_size")
SET_BY_YOU = "set by you"
DEFAULT = "default"

# At least two painted objects: one could be a cap cut by the painted slice, or two
# objects painted as one; with two, the larger half of them says the size.
MIN_OBJECTS = 2
# A cross-section under 3 x 3 voxels is a click or a speck, no object's outline.
MIN_AREA = 9
# A painted object (an outline filled in) covers about pi/4 of its box in section (an
# ellipse); a stroke drawn diagonally or bent covers a small share of its box. 0.4 keeps
# the objects' sections and drops those strokes.
MIN_FILL = 0.4
# A stroke along an axis fills its box but is a brush wide and many brushes long;
# sections of objects (nuclei, mitochondria across) are rarely 4 times longer than wide.
MIN_ASPECT = 0.25
# Seeds at least the typical radius apart. A lobe or a waist of an object (a nucleus
# shaped like a peanut, a bumpy outline) gives the distance to the background a second
# maximum within about a radius of the deepest one, which a window of one radius
# swallows; two touching objects' middles are about a diameter apart, more than a radius
# even when squeezed together or when one is smaller, and stay a seed each. Half a
# radius (tried first) still split the peanut-shaped nuclei of the tests in two.
SEED_FRACTION = 1.0
# Objects smaller than a ball half as wide as the typical painted one (1/8 of its volume)
# are dropped: fragments and specks go, an object cut by the volume's face or smaller
# than the typical one by a factor two in width stays.
MIN_SIZE_FRACTION = 1 / 8


@dataclass(frozen=True)
class PaintedObjects:
    """The objects painted for one channel.

    Attributes
    ----------
    count : int
        Painted objects found (connected components with at least one filled-in section;
        strokes and clicks are not counted).
    extent : float
        Their typical width in section (in the plane of the last two axes), in voxels
        of the finest axis: the median of the larger half of the objects' widths, each
        object's width being the diameter of the widest disc inside its filled sections.
        0 without objects.
    """

    count: int
    extent: float


@dataclass(frozen=True)
class RolesFromPainting:
    """Roles with the estimated parameters, and where each value came from.

    Attributes
    ----------
    base : dict of str to ChannelRole
        The roles the estimate started from (the editor's, or the checkpoint's).
    roles : dict of str to ChannelRole
        ``base`` with ``seed_distance`` and ``min_size`` estimated from the painting
        where the user did not set them.
    sources : dict of str to dict of str to str
        Per channel with a role, per estimated parameter: :data:`SET_BY_YOU`,
        ``"from your painting (N objects, median extent E voxels)"`` or :data:`DEFAULT`.
    """

    base: dict[str, ChannelRole]
    roles: dict[str, ChannelRole]
    sources: dict[str, dict[str, str]] = field(default_factory=dict)


def painted_objects(
    corrections: np.ndarray, channel: int, voxel_size: Sequence[float] | None = None
) -> PaintedObjects:
    """The objects painted for ``channel`` (label ``channel + 2``) and their typical width.

    Parameters
    ----------
    corrections : (Z, Y, X) or (Y, X) array
        0 unpainted, 1 background, ``k >= 2`` channel ``k - 2``.
    channel : int
        The channel's index among the model's outputs.
    voxel_size : sequence of float, optional
        The volume's voxel size; widths are measured in voxels of its finest axis.

    Returns
    -------
    PaintedObjects

    Notes
    -----
    Strokes on a few slices paint partial objects: only the sections on the painted
    slices are measured, never the extent across slices. A section counts when it is
    filled in (:data:`MIN_FILL`, :data:`MIN_ASPECT`, :data:`MIN_AREA`), so a thin stroke
    does not pass for a small object. A slice may cut an object anywhere between its
    cap and its middle: the larger half of the widths is the one near the middle, whose
    median is the typical width.
    """
    painted = np.asarray(corrections) == channel + 2
    if painted.ndim not in (2, 3):
        raise ValueError(f"expected (Y, X) or (Z, Y, X) corrections, got shape {painted.shape}.")
    spacing = relative_sampling(voxel_size, painted.ndim) or (1.0,) * painted.ndim
    dy, dx = spacing[-2:]
    labels, _ = ndimage.label(painted)
    widths = []
    for i, box in enumerate(ndimage.find_objects(labels), 1):
        if box is None:
            continue
        piece = labels[box] == i
        sections = piece.reshape(-1, *piece.shape[-2:])
        widest = max((_section_width(s, dy, dx) for s in sections), default=0.0)
        if widest > 0:
            widths.append(widest)
    if not widths:
        return PaintedObjects(0, 0.0)
    ordered = np.sort(np.asarray(widths))
    return PaintedObjects(len(widths), float(np.median(ordered[len(ordered) // 2:])))


def _section_width(section: np.ndarray, dy: float, dx: float) -> float:
    """A filled-in section's width: the diameter of the widest disc inside it, in units of
    the finest axis (0 for a stroke, a click or nothing).

    The inscribed disc, not the box: touching objects painted with one label are one
    connected section, whose box is that of all of them, but whose widest disc is the
    widest of theirs.
    """
    area = int(section.sum())
    if area < MIN_AREA:
        return 0.0
    rows, cols = np.flatnonzero(section.any(axis=1)), np.flatnonzero(section.any(axis=0))
    h, w = rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1
    height, width = h * dy, w * dx
    if area / (h * w) < MIN_FILL or min(height, width) < MIN_ASPECT * max(height, width):
        return 0.0
    inside = np.pad(section[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1], 1)
    depth = ndimage.distance_transform_edt(inside, sampling=(dy, dx))
    # The depth of a voxel's middle: a disc of n voxels across is about 2 * depth - 1 wide.
    return float(2 * depth.max() - min(dy, dx))


def parameters_for(
    painted: PaintedObjects, ndim: int, voxel_size: Sequence[float] | None = None
) -> tuple[float, int]:
    """``(seed_distance, min_size)`` for objects about ``painted.extent`` wide.

    ``seed_distance`` is in voxels of the finest axis (as the objects step reads it),
    at least 1; ``min_size`` in the volume's own voxels: :data:`MIN_SIZE_FRACTION` of a
    ball (a disc in 2D) ``painted.extent`` wide.
    """
    spacing = relative_sampling(voxel_size, ndim) or (1.0,) * ndim
    radius = painted.extent / 2
    seed_distance = max(1.0, round(SEED_FRACTION * radius, 1))
    if ndim == 3:
        typical = math.pi / 6 * painted.extent**3
    else:
        typical = math.pi / 4 * painted.extent**2
    min_size = int(MIN_SIZE_FRACTION * typical / math.prod(spacing))
    return seed_distance, min_size


def describe(painted: PaintedObjects) -> str:
    """``"from your painting (4 objects, median extent 30 voxels)"``."""
    return (f"from your painting ({painted.count} object{'s' * (painted.count != 1)}, "
            f"median extent {painted.extent:.3g} voxels)")


def roles_from_painting(
    roles: Mapping[str, ChannelRole],
    corrections: np.ndarray | None,
    channel_names: Sequence[str],
    voxel_size: Sequence[float] | None = None,
    user_set: Mapping[str, Collection[str]] | None = None,
) -> RolesFromPainting:
    """Each object channel's ``seed_distance`` and ``min_size`` from its painted objects.

    Parameters
    ----------
    roles : channel name -> ChannelRole
        The roles as they are (the editor's, the checkpoint's, ``--role``'s).
    corrections : array or None
        The painting (0 unpainted, 1 background, ``k >= 2`` channel ``k - 2``); None:
        nothing painted, every value stays.
    channel_names : the model's output channels, in order (their index is the label - 2).
    voxel_size : the volume's voxel size, optional.
    user_set : channel name -> names of the parameters the user set
        Never estimated: they stay as given, with the source :data:`SET_BY_YOU`.

    Returns
    -------
    RolesFromPainting
        Only channels with the ``"object"`` role are estimated: a boundary channel's
        painted voxels are its boundary (membranes), which say nothing of the regions'
        size. A channel with fewer than :data:`MIN_OBJECTS` painted objects keeps its
        values (source :data:`DEFAULT`).
    """
    user_set = user_set or {}
    names = [str(n) for n in channel_names]
    out = dict(roles)
    sources: dict[str, dict[str, str]] = {}
    for channel, role in roles.items():
        if role.role is None:
            continue
        mine = set(user_set.get(channel, ()))
        source = {name: SET_BY_YOU if name in mine else DEFAULT for name in ESTIMATED}
        sources[channel] = source
        free = [name for name in ESTIMATED if name not in mine]
        if role.role != "object" or not free or corrections is None or channel not in names:
            continue
        painted = painted_objects(corrections, names.index(channel), voxel_size)
        if painted.count < MIN_OBJECTS:
            continue
        seed_distance, min_size = parameters_for(painted, np.ndim(corrections), voxel_size)
        out[channel] = replace(
            role,
            seed_distance=seed_distance if "seed_distance" in free else role.seed_distance,
            min_size=min_size if "min_size" in free else role.min_size)
        for name in free:
            source[name] = describe(painted)
    return RolesFromPainting(dict(roles), out, sources)


def user_set_from_sources(sources: Mapping[str, Mapping[str, str]]) -> dict[str, set[str]]:
    """The parameters whose recorded source is :data:`SET_BY_YOU`, per channel (a
    checkpoint's recorded sources: what the user set before stays theirs)."""
    return {channel: {name for name, source in per.items() if source == SET_BY_YOU}
            for channel, per in sources.items()}
