"""Object parameters that follow the structure: seed distance and min size from the painting.

The roles' parameters (:class:`~napari_finetune.objects.roles.ChannelRole`) are the
sample's, sized for mitochondria: nuclei 30 voxels across get split, cells merged.
The objects a user painted for a channel (its label, ``k >= 2`` for channel ``k - 2``,
in the corrections) say how large that channel's objects are; here they give the
channel's ``seed_distance`` and ``min_size``, unless the user set them. Where the
painting holds fewer than :data:`MIN_OBJECTS` objects (strokes only), the objects the
model predicts for the channel say it instead, when its probability is given (as
cellpose estimates a diameter from the image); without either the values stay.

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
# The predicted objects change a channel's values only when they are of another size than
# the values are for: more than this many times as wide as a seed distance's object (two
# seed distances across, SEED_FRACTION), or less than 1/this. Within it the values the
# model came with stay: they were chosen by measurement on its own objects (the
# sample's mitochondria, 8 voxels for a typical 10 predicted: estimated anew there, their
# F1 fell from 0.907 to 0.865), while nuclei 31 to 55 voxels wide are 4 to 7 times as wide.
OTHER_SIZE = 2.0


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
    corrections: np.ndarray, channel: int, voxel_size: Sequence[float] | None = None,
    narrowest: float = 0.0,
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
    narrowest : float
        Pieces narrower than this (in voxels of the finest axis) are strokes, not
        objects: dabs of the brush inside objects fill their box as an object does.

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
        if widest > 0 and widest >= narrowest:
            widths.append(widest)
    if not widths:
        return PaintedObjects(0, 0.0)
    ordered = np.sort(np.asarray(widths))
    return PaintedObjects(len(widths), float(np.median(ordered[len(ordered) // 2:])))


def predicted_objects(
    prob: np.ndarray, threshold: float, voxel_size: Sequence[float] | None = None
) -> PaintedObjects:
    """The objects the model predicts for one channel (``prob > threshold``), and their
    typical width.

    Parameters
    ----------
    prob : (Z, Y, X) or (Y, X) array
        The channel's probability.
    threshold : float
        The role's threshold: foreground above it.
    voxel_size : sequence of float, optional
        The volume's voxel size; widths are in voxels of its finest axis.

    Returns
    -------
    PaintedObjects
        ``count``: the connected pieces at least :data:`MIN_SIZE_FRACTION` of the
        typical one (those the objects step keeps); ``extent``: the typical width.
        ``PaintedObjects(0, 0.0)`` when fewer than :data:`MIN_OBJECTS` pieces are wider
        than a speck.

    Notes
    -----
    A piece's width is the widest disc inside any of its sections (in the plane of the
    last two axes, as for painted objects: a stack a few sections deep would otherwise
    measure its depth). The typical width is the width of the piece holding the median
    foreground voxel, not the median piece: a model unsure of a new volume predicts its
    objects with thousands of specks of a few voxels beside them (a real nuclei volume:
    2402 pieces for 10 nuclei), which would make the median piece a speck.
    """
    foreground = np.asarray(prob) > threshold
    if foreground.ndim not in (2, 3):
        raise ValueError(f"expected (Y, X) or (Z, Y, X) probability, got shape {foreground.shape}.")
    spacing = relative_sampling(voxel_size, foreground.ndim) or (1.0,) * foreground.ndim
    dy, dx = spacing[-2:]
    pieces, n = ndimage.label(foreground)
    if n < MIN_OBJECTS:
        return PaintedObjects(0, 0.0)
    depth = np.zeros(foreground.shape, np.float32)
    for index in np.ndindex(foreground.shape[:-2]):
        depth[index] = ndimage.distance_transform_edt(foreground[index], sampling=(dy, dx))
    ids = np.arange(1, n + 1)
    # The depth of a voxel's middle: a disc of n voxels across is about 2 * depth - 1 wide.
    widths = 2 * np.asarray(ndimage.maximum(depth, pieces, ids), np.float64) - min(dy, dx)
    sizes = np.bincount(pieces.ravel(), minlength=n + 1)[1:]
    real = widths >= math.sqrt(MIN_AREA)
    if int(real.sum()) < MIN_OBJECTS:
        return PaintedObjects(0, 0.0)
    order = np.argsort(widths)
    held = np.cumsum(sizes[order])
    typical = float(widths[order][np.searchsorted(held, held[-1] / 2)])
    _, min_size = parameters_for(PaintedObjects(n, typical), foreground.ndim, voxel_size)
    return PaintedObjects(int((sizes >= max(min_size, 1)).sum()), typical)


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


def _other_size(extent: float, seed_distance: float) -> bool:
    """Whether objects ``extent`` wide are of another size than ``seed_distance`` is for
    (:data:`OTHER_SIZE`)."""
    made_for = 2 * seed_distance / SEED_FRACTION
    return not made_for / OTHER_SIZE <= extent <= made_for * OTHER_SIZE


def describe_predicted(predicted: PaintedObjects) -> str:
    """``"from the prediction (10 objects, typical width 46 voxels)"``."""
    return (f"from the prediction ({predicted.count} object{'s' * (predicted.count != 1)}, "
            f"typical width {predicted.extent:.3g} voxels)")


def roles_from_painting(
    roles: Mapping[str, ChannelRole],
    corrections: np.ndarray | None,
    channel_names: Sequence[str],
    voxel_size: Sequence[float] | None = None,
    user_set: Mapping[str, Collection[str]] | None = None,
    probabilities: Mapping[str, np.ndarray] | None = None,
) -> RolesFromPainting:
    """Each object channel's ``seed_distance`` and ``min_size`` from its painted objects,
    else from its predicted ones.

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
    probabilities : channel name -> (Z, Y, X) or (Y, X) probability, optional
        The last prediction: a channel whose painting holds fewer than
        :data:`MIN_OBJECTS` objects takes the values from its predicted objects
        (:func:`predicted_objects`) when these are of another size than its values are
        for (:data:`OTHER_SIZE`).

    Returns
    -------
    RolesFromPainting
        Only channels with the ``"object"`` role are estimated: a boundary channel's
        painted voxels are its boundary (membranes), which say nothing of the regions'
        size. A channel with fewer than :data:`MIN_OBJECTS` painted objects and no
        probability (or fewer predicted objects) keeps its values (source :data:`DEFAULT`).
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
        if role.role != "object" or not free:
            continue
        found, ndim, said = PaintedObjects(0, 0.0), 0, DEFAULT
        prob = (probabilities or {}).get(channel)
        predicted = (PaintedObjects(0, 0.0) if prob is None
                     else predicted_objects(prob, role.threshold, voxel_size))
        if corrections is not None and channel in names:
            # Dabs of the brush inside objects (a few voxels across, filled) are no
            # objects: next to the predicted objects' width, a painted object is one
            # only if at least half as wide.
            found = painted_objects(corrections, names.index(channel), voxel_size,
                                    narrowest=predicted.extent / 2)
            ndim, said = np.ndim(corrections), describe(found)
        if (prob is not None and found.count < MIN_OBJECTS and predicted.count >= MIN_OBJECTS
                and _other_size(predicted.extent, role.seed_distance)):
            found, ndim, said = predicted, np.ndim(prob), describe_predicted(predicted)
        if found.count < MIN_OBJECTS:
            continue
        seed_distance, min_size = parameters_for(found, ndim, voxel_size)
        out[channel] = replace(
            role,
            seed_distance=seed_distance if "seed_distance" in free else role.seed_distance,
            min_size=min_size if "min_size" in free else role.min_size)
        for name in free:
            source[name] = said
    return RolesFromPainting(dict(roles), out, sources)


def user_set_from_sources(sources: Mapping[str, Mapping[str, str]]) -> dict[str, set[str]]:
    """The parameters whose recorded source is :data:`SET_BY_YOU`, per channel (a
    checkpoint's recorded sources: what the user set before stays theirs)."""
    return {channel: {name for name, source in per.items() if source == SET_BY_YOU}
            for channel, per in sources.items()}


def sizing_time_point(corrections: np.ndarray | None, time_points: int) -> int:
    """The time point a time series' objects are sized at: the most painted one, else
    (nothing painted) the middle one.

    Objects of one structure keep their size over time, so one time point says it;
    time points stacked as one volume would join objects across them.

    Parameters
    ----------
    corrections : (T, ...) array or None
        The painting of every time point; None: nothing painted.
    time_points : int
        How many time points the series has.

    Returns
    -------
    int
    """
    if corrections is not None and len(corrections):
        painted = [int(np.count_nonzero(frame)) for frame in corrections]
        if max(painted) > 0:
            return int(np.argmax(painted))
    return time_points // 2
