"""Instance labels from one channel's probability, in memory.

Both functions return uint32 labels, ids 1..N consecutive, 0 where there is no
instance. They are deterministic and single-threaded (scipy.ndimage and
scikit-image), so a block of a larger volume gives the same labels wherever it
is computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy import ndimage, sparse
from scipy.sparse.csgraph import connected_components
from skimage.morphology import h_maxima, reconstruction
from skimage.segmentation import watershed

from napari_finetune.objects.roles import ChannelRole
from napari_finetune.voxel_size import sampling as relative_sampling
from napari_finetune.voxel_size import thick_sections

# Voxel size relative to the finest axis (:func:`napari_finetune.voxel_size.sampling`), or
# None: every distance below is then in voxels of the finest axis.
Sampling = Sequence[float] | None

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


def _label(mask: np.ndarray, what: str, full: bool = False) -> tuple[np.ndarray, int]:
    # int64 only where int32 could not count every component (a checkerboard has size/2).
    out = np.int64 if mask.size // 2 + 1 > np.iinfo(np.int32).max else np.int32
    structure = ndimage.generate_binary_structure(mask.ndim, mask.ndim if full else 1)
    labels, n = ndimage.label(mask, structure, output=out)
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
    common case: most regions are one object), which is what makes this fast.
    Only regions with two or more markers are flooded, each in its bounding box.
    A region without a marker keeps an id of its own (a small one goes with
    ``min_size``).
    """
    out, several = _one_marker_regions(markers, n_markers, regions, n_regions)
    boxes = ndimage.find_objects(regions)
    for region in several:
        box = boxes[region - 1]
        mask = regions[box] == region
        grown = watershed(surface[box], markers[box] * mask, mask=mask)
        out[box][mask] = grown[mask]
    return out


def _one_marker_regions(
    markers: np.ndarray, n_markers: int, regions: np.ndarray, n_regions: int
) -> tuple[np.ndarray, np.ndarray]:
    """Labels giving each region with exactly one marker that marker's id, whole.

    Regions without a marker get new ids after the markers'; regions with
    several get one of their markers' ids for now. Returns the labels and the
    ids of the regions with several markers.
    """
    inside = markers > 0
    region_of_marker = np.zeros(n_markers + 1, np.int64)
    region_of_marker[markers[inside]] = regions[inside]
    per_region = np.bincount(region_of_marker[1:], minlength=n_regions + 1)
    lut = np.zeros(n_regions + 1, np.int64)
    lut[region_of_marker[1:]] = np.arange(1, n_markers + 1)
    lonely = np.flatnonzero(per_region == 0)
    lonely = lonely[lonely > 0]  # region 0 is the background, not a region
    _check_count(n_markers + lonely.size, "instances")
    lut[lonely] = np.arange(n_markers + 1, n_markers + 1 + lonely.size)
    return lut[regions], np.flatnonzero(per_region >= 2)


def _coarse_interior(interior: np.ndarray) -> np.ndarray:
    """2x coarser interior: a coarse voxel is interior only if all its fine voxels are.

    "All", so a boundary one voxel thin still separates regions at the coarse scale.
    The volume's edge is padded with interior: the edge is no boundary.
    """
    pad = [(0, s % 2) for s in interior.shape]
    full = np.pad(interior, pad, constant_values=True)
    blocks = full.reshape([v for s in full.shape for v in (s // 2, 2)])
    return np.asarray(blocks.all(axis=tuple(range(1, 2 * full.ndim, 2))))


def _floating_specks(boundary: np.ndarray, narrowest: float,
                     spacing: Sequence[float] | None = None) -> np.ndarray:
    """Boundary pieces that touch no other boundary and no face, narrower than ``narrowest``.

    A piece of boundary joined to nothing (full connectivity, so a membrane touching the
    network only diagonally is joined) separates no two cells: it can only enclose a
    pocket, and one narrower than ``narrowest`` along some axis encloses none wide enough
    to hold a seed. Such specks are what a model unsure of its membrane predicts inside
    cells (on mitochondria, say), and each one dents the interior's depth, giving one
    cell several domes and so several seeds. A piece touching the array's face is kept:
    the membrane may go on beyond it (a crop, a block's view). ``spacing`` is each
    axis's voxel length in the unit of ``narrowest`` (None: 1 on every axis).
    """
    spacing = spacing or (1.0,) * boundary.ndim
    pieces, _ = _label(boundary, "boundary pieces", full=True)
    boxes = ndimage.find_objects(pieces)
    speck = np.zeros(len(boxes) + 1, bool)
    for i, box in enumerate(boxes, 1):
        if box is None:
            continue
        inside = all(0 < s.start and s.stop < n for s, n in zip(box, boundary.shape, strict=True))
        extents = ((s.stop - s.start) * d for s, d in zip(box, spacing, strict=True))
        speck[i] = inside and min(extents) < narrowest
    return speck[pieces]


def _fine(coarse: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``coarse`` repeated 2x along every axis, cropped to ``shape``."""
    for axis in range(coarse.ndim):
        coarse = np.repeat(coarse, 2, axis=axis)
    return coarse[tuple(slice(0, s) for s in shape)]


def _depth_seeds(depth: np.ndarray, h: float, lowest: float) -> tuple[np.ndarray, int]:
    """Seeds of the depth's h-maxima at least ``lowest`` deep, one id per dome.

    :func:`skimage.morphology.h_maxima` marks the summit voxels of each dome
    that rises ``h`` above its saddles; two summits of one dome with the same
    height (common on the grid's distances, and on a volume's face, where a cut
    cell is deepest along a line) are marked apart. Labelled as they are, they
    seeded one cell twice (the 32x96x96 crop: 8 cells for 4). They are joined
    here by the dome they stand in: the part of the depth above its
    reconstruction from ``depth - h``, connected through everything within
    ``h`` of the summit, and cut at every saddle ``h`` or more below it.
    """
    summits = h_maxima(depth, np.float32(h)).astype(bool) & (depth >= lowest)
    if not summits.any():
        return np.zeros(depth.shape, np.int32), 0
    floor = reconstruction(depth - np.float32(h), depth, method="dilation")
    # Full connectivity, as h_maxima's: a dome touching itself only diagonally is one.
    domes, _ = _label(depth > floor, "seeds", full=True)
    ids = np.unique(domes[summits])
    lut = np.zeros(int(domes.max()) + 1, np.int32)
    lut[ids] = np.arange(1, ids.size + 1, dtype=np.int32)
    # Only the summits are seeds (the dome's id): a dome's lower rim may reach a gap.
    return np.where(summits, lut[domes], 0).astype(np.int32), int(ids.size)


def _deep_cores(
    cores: np.ndarray, seed_distance: float, spacing: Sequence[float] | None
) -> tuple[np.ndarray, int]:
    """The connected cores at least ``max(1, seed_distance / 4)`` deep (their own distance
    transform, physical), labelled 1..N; the shallower ones are no seeds.

    A model unsure of a new volume predicts its objects speckled: a real nuclei volume's
    nuclei held 50 to 214 cores each, a few voxels thick, and each core became an object
    (77 objects for 7). The middle of a sure object is a core as deep as the object is
    wide. At the sample's seed distance (4) every core is deep enough: its objects are
    labelled as before.
    """
    labels, n = _label(cores, "seeds")
    if not n:
        return labels, 0
    depth = ndimage.distance_transform_edt(cores, sampling=spacing).astype(np.float32)
    deepest = np.asarray(ndimage.maximum(depth, labels, np.arange(1, n + 1)), np.float32)
    deep = np.concatenate([[False], deepest >= max(1.0, seed_distance / 4)])
    lut = np.zeros(n + 1, np.int32)
    lut[deep] = np.arange(1, int(deep.sum()) + 1, dtype=np.int32)
    return lut[labels], int(deep.sum())


def _domes_where_no_core(
    markers: np.ndarray, n_markers: int, regions: np.ndarray,
    seed_distance: float, spacing: Sequence[float] | None, surface: np.ndarray,
) -> tuple[np.ndarray, int]:
    """``markers`` with a seed added for every dome of the shape that holds no core: the
    summit of each dome of the depth rising ``seed_distance / 2`` (and 1) above its saddle
    (h-maxima, as the boundary role's cells) that no core reaches (below), numbered after
    the markers'; a dome's catchment is the depth's watershed from the domes. In
    the regions given such a seed ``surface`` (the flood's, changed in place) becomes the
    negated depth: a region seeded by its shape is cut at its necks, while a speckled
    probability would cut touching objects anywhere.

    A region whose probability has no deep core (a speckled object, or touching ones the
    model is unsure of everywhere) is split by its shape alone: touching objects keep a
    dome each, the neck between them shallower than both middles, while a bump of a
    ragged outline rises too little to be a middle. The same holds for an object beside a
    sure one: a model sure of one of two touching nuclei gives the pair one core, and
    that core seeded both as one object (the starter model on a real nuclei volume after
    20 steps: two nuclei of 17299 and 17510 voxels as one object, IoU 0.42 and 0.44).
    A dome is cored, and adds nothing, when a core reaches its top (within ``h`` of its
    summit: a long object sure along its length has one core over all its domes) or lies
    mostly in its catchment (a core off a dome's middle, a crescent at one side). A sure
    nucleus's core reaching a few voxels across the neck into its neighbour's catchment
    cores that neighbour by neither rule.
    """
    h = max(1.0, seed_distance / 2)
    out = markers.astype(np.int32, copy=True)
    n_out = n_markers
    # Region by region, each in its box: regions lie apart (background between them), so
    # one region's domes and catchments are the same with or without the others, and
    # the work is the foreground's size, not the volume's.
    for region, box in enumerate(ndimage.find_objects(regions), 1):
        if box is None:
            continue
        # One voxel more on every side the volume has: the background around the region,
        # which the depth measures from (a face of the volume is none).
        box = tuple(slice(max(b.start - 1, 0), min(b.stop + 1, n))
                    for b, n in zip(box, regions.shape, strict=True))
        mask = regions[box] == region
        cores = np.where(mask, markers[box], 0)
        seeds = _coreless_domes(mask, cores, h, spacing)
        if seeds is None:
            continue
        domes, lonely_ids, depth = seeds
        _check_count(n_out + lonely_ids.size, "seeds")
        lut = np.zeros(int(domes.max()) + 1, np.int32)
        lut[lonely_ids] = np.arange(n_out + 1, n_out + 1 + lonely_ids.size, dtype=np.int32)
        lonely = lut[domes] > 0
        out[box][lonely] = lut[domes[lonely]]
        n_out += lonely_ids.size
        surface[box][mask] = -depth[mask]
    return out, n_out


def _shape_depth(mask: np.ndarray, spacing: Sequence[float] | None) -> np.ndarray:
    """The depth of ``mask`` (float32, physical): within each section on thick sections
    (:func:`~napari_finetune.voxel_size.thick_sections`), else in 3D.

    A few thick sections cap the depth through z, not the objects' width: on a real
    nuclei volume (5 sections of 1 um, 0.2 um pixels) two touching nuclei were 15 deep
    in 3D, 30 wide, with a neck 5 deep, so neither rose half a seed distance (13, from
    their width) above it, and the pair stayed one object. Within a section the
    depth is the width the sizes were measured on (painted or predicted sections).
    """
    if spacing is not None and thick_sections(spacing, mask.ndim):
        out = np.zeros(mask.shape, np.float32)
        for k, section in enumerate(mask):
            if section.any():
                out[k] = ndimage.distance_transform_edt(section, sampling=spacing[1:])
        return out
    return ndimage.distance_transform_edt(mask, sampling=spacing).astype(np.float32)


def _coreless_domes(
    mask: np.ndarray, cores: np.ndarray, h: float, spacing: Sequence[float] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """One region's domes (its depth's h-maxima at least ``h`` deep, labelled), the ids
    of those no core reaches (:func:`_domes_where_no_core`) and its depth; None when no
    dome lacks a core.

    Only a region holding a voxel at least ``h`` deep and ``h`` from every core can have
    one: a summit is ``h`` deep, and every voxel closer to it than ``h`` lies in its top
    and its catchment (the depth falls by at most the distance). The rest, a sure model's
    objects (all of the sample's mitochondria but 2 of 138), skip the domes' work.
    """
    depth = _shape_depth(mask, spacing)
    deep = depth >= h
    if not deep.any():
        return None
    if cores.any():
        deep &= ndimage.distance_transform_edt(cores == 0, sampling=spacing) >= h
        if not deep.any():
            return None
    domes, n_domes = _depth_seeds(depth, h, h)
    if not n_domes:
        return None
    # Each dome's catchment within the region: the watershed of the depth from the summits.
    basins = watershed(-depth, domes, mask=mask)
    # A dome is cored when a core lies mostly in its catchment, or reaches its top (within
    # h of its summit): a long object sure along its length has one core over many domes.
    cored = np.zeros(n_domes + 1, bool)
    cored[0] = True
    if cores.any():
        cored[majority_links(cores, basins)[:, 1]] = True
        summit = np.zeros(n_domes + 1, np.float32)
        summit[1:] = ndimage.maximum(depth, basins, np.arange(1, n_domes + 1))
        cored[basins[(cores > 0) & (depth > summit[basins] - h)]] = True
    lonely = np.flatnonzero(~cored)
    return (domes, lonely, depth) if lonely.size else None


def majority_links(core_ids: np.ndarray, seen_as: np.ndarray) -> np.ndarray:
    """(k, 2) pairs: each nonzero id of ``core_ids`` with the nonzero id ``seen_as`` gives
    most of its voxels (ties: the smaller id)."""
    both = (core_ids > 0) & (seen_as > 0)
    if not both.any():
        return np.empty((0, 2), np.int64)
    pairs, counts = np.unique(
        np.stack([core_ids[both], seen_as[both]], axis=1).astype(np.int64),
        axis=0, return_counts=True,
    )
    # Sorted by id, then most voxels first: the first row of each id is its majority.
    order = np.lexsort((pairs[:, 1], -counts, pairs[:, 0]))
    pairs = pairs[order]
    first = np.ones(len(pairs), bool)
    first[1:] = pairs[1:, 0] != pairs[:-1, 0]
    return pairs[first]


def boundary_instances(
    prob: np.ndarray, params: ChannelRole | None = None, voxel_size: Sampling = None
) -> np.ndarray:
    """Regions enclosed by a boundary channel (cells between membranes).

    Interior is ``prob < threshold``. Seeds are the maxima of the interior's
    depth (its euclidean distance transform) at least ``seed_distance`` voxels
    deep that stand at least ``seed_distance / 2`` (and 2) voxels above the saddle joining
    them to any deeper maximum (h-maxima, :func:`skimage.morphology.h_maxima`).
    Two cells joined through a gap in a predicted membrane keep a maximum
    each, since the gap is shallower than both cells' middles; a bumpy or
    elongated cell keeps one, since its bumps rise less than that above the
    ridge between them. A connected piece of interior holding one seed is that
    seed's region, whole; one holding several (cells joined through gaps) is
    shared out by a watershed of the depth from the seeds, which cuts where
    the interior is narrowest: across the gap. The boundary stays 0, except
    specks of it floating inside a cell (touching no other boundary and no
    face, too narrow to enclose a seeded cell), which are interior: each
    would dent the depth and seed its cell twice.

    The depth, the seeds and the sharing out are computed at half resolution,
    which is what keeps this fast (seconds for the sample's 4 Mvoxel): only
    the cut across a gap is placed to within 2 voxels; every region's outline
    is the full-resolution interior's.

    Sections much thicker than their pixels (a (Z, Y, X) volume whose z voxel
    is at least :data:`~napari_finetune.voxel_size.THICK_SECTIONS` times its
    finest in-plane voxel, serial-section EM) are made section by section and
    linked across z. Between two such sections a neurite's membrane, tilted
    through the section, moves further than its own width, so the predicted
    membrane has no 3D wall between the sections' cells: the interior is
    connected through the sections above and below, and neighbouring cells
    join there. On the labelled slices of two CREMI crops (40 x 4 x 4 nm) the
    cells made in 3D had adapted Rand errors 0.323 and 0.569, the cells of each
    section alone 0.248 and 0.421, with fewer splits and fewer merges. So each
    section's cells are made as a 2D image's (depths in its own (Y, X) voxel
    size), and a cell on one section and one on the next are the same object
    when their overlap is more than half of each of them (a mutual majority: a
    cell has at most one such partner on either side, so an object never holds
    two cells of one section); chains of such links are the objects. Thinner
    sections, an unknown voxel size or a 2D image: the depths are 3D, as above.

    Parameters
    ----------
    prob : (Z, Y, X) or (Y, X) array
        Probability of the boundary channel.
    params : ChannelRole, optional
        Threshold, seed_distance, min_size; default ``ChannelRole("boundary")``.
        ``min_size`` counts an object's voxels over all its sections, also when
        made section by section.
    voxel_size : sequence of float, optional
        The volume's voxel size: an anisotropic one measures depths in physical
        units, in voxels of the finest axis (``seed_distance`` 4 on a (40, 8, 8) nm
        volume: 32 nm, not 4 sections), and sections at least
        :data:`~napari_finetune.voxel_size.THICK_SECTIONS` times thicker than
        their finest pixel are made one by one and linked (above); None or
        isotropic: in voxels, in 3D, as before.

    Returns
    -------
    np.ndarray of uint32
        Ids 1..N, 0 on the boundary and on removed fragments.
    """
    params = params or ChannelRole("boundary")
    prob = _probability(prob, params, "boundary")
    # min_size counts whole objects, after linking: per section it would drop the thin
    # end or a small cross-section of a cell running through many sections and cut the
    # object in two, and it would mean one thing in 3D and another here (blockwise too
    # counts it on whole objects). So a role's min_size keeps its meaning on either path.
    if thick_sections(voxel_size, prob.ndim):
        cells = _linked_sections(prob, params, relative_sampling(voxel_size, 2))
    else:
        cells = _cells(prob, params, relative_sampling(voxel_size, prob.ndim))
    return _keep_big(cells, params.min_size)


def _cells(prob: np.ndarray, params: ChannelRole, spacing: Sampling) -> np.ndarray:
    """:func:`boundary_instances`' cells of ``prob`` in its own dimensions, before
    ``min_size`` (integer ids, 0 on the boundary)."""
    interior = prob < params.threshold
    coarse = _coarse_interior(interior)
    # Specks of boundary floating inside cells are interior: each would dent the depth
    # and seed its cell twice (issue 42: the sparse model's unseen second volume, 48
    # cells for 43, VOI split 0.37). Found on the coarse grid, where the seeds are: a
    # speck there is one at full resolution too (its coarse neighbours are all interior).
    # A seed needs depth seed_distance: a pocket 2 * seed_distance wide, seed_distance
    # coarse voxels; a speck narrower than that along some axis encloses no seeded cell.
    specks = _floating_specks(~coarse, params.seed_distance, spacing)
    if specks.any():
        coarse |= specks
        interior |= _fine(specks, interior.shape)
    # Coarse voxels are 2 voxels wide: depths and heights are halved. A height under
    # one coarse voxel is the grid's own unevenness (distances are square roots of
    # whole numbers), which would seed a bumpy cell twice, differently in a block's view.
    depth = ndimage.distance_transform_edt(coarse, sampling=spacing).astype(np.float32)
    coarse_markers, n_markers = _depth_seeds(depth, max(1.0, params.seed_distance / 4),
                                             params.seed_distance / 2)
    regions, n_regions = _label(interior, "interior regions")
    markers = _fine(coarse_markers, interior.shape)
    labels, several = _one_marker_regions(markers, n_markers, regions, n_regions)
    if several.size:
        is_shared = np.zeros(n_regions + 1, bool)
        is_shared[several] = True
        shared = is_shared[regions]
        # Every coarse voxel holding a shared voxel is flooded, so each gets a seed's id;
        # the regions' one-seed neighbours are no part of it.
        reach = ~_coarse_interior(~shared)
        grown = watershed(-depth, coarse_markers * reach, mask=reach)
        labels[shared] = _fine(grown, interior.shape)[shared]
    return labels


def _linked_sections(prob: np.ndarray, params: ChannelRole, spacing: Sampling) -> np.ndarray:
    """Each z section's cells (2D, depths in ``spacing``, the (Y, X) sampling), linked
    across z by mutual majority (:func:`boundary_instances`); ids of the chains of
    links, before ``min_size`` (integer, 0 on the boundary, not consecutive)."""
    sections = np.zeros(prob.shape, np.int64)
    counts = []
    used = 0  # ids handed out so far: section k's ids follow section k-1's
    for k, section in enumerate(prob):
        cells = _cells(section, params, spacing)
        n = int(cells.max(initial=0))
        _check_count(used + n, "cells")
        sections[k] = np.where(cells > 0, cells.astype(np.int64) + used, 0)
        counts.append((used, n))
        used += n
    sizes = np.bincount(sections.ravel(), minlength=used + 1)  # a cell lies on one section
    links = [_mutual_majority(sections[k], sections[k + 1], counts[k], counts[k + 1], sizes)
             for k in range(len(prob) - 1)]
    pairs = np.concatenate(links) if links else np.empty((0, 2), np.int64)
    graph = sparse.coo_matrix(
        (np.ones(len(pairs), np.int8), (pairs[:, 0], pairs[:, 1])), shape=(used + 1, used + 1)
    )
    _, component = connected_components(graph, directed=False)
    # Node 0 (the boundary) is linked to nothing: its component is its own, and 0 here.
    lut = component.astype(np.int64) + 1
    lut[0] = 0
    return lut[sections]


def _mutual_majority(low: np.ndarray, high: np.ndarray, low_ids: tuple[int, int],
                     high_ids: tuple[int, int], sizes: np.ndarray) -> np.ndarray:
    """(k, 2) pairs of a cell of ``low`` and one of ``high`` (two neighbouring sections)
    whose overlap is more than half of each; ``*_ids`` are (offset, count) of the
    sections' ids, ``sizes`` every id's voxels."""
    both = (low > 0) & (high > 0)
    if not both.any():
        return np.empty((0, 2), np.int64)
    (low_offset, _), (high_offset, n_high) = low_ids, high_ids
    # One integer per pair of section-local ids: at most (Y * X) ** 2, within int64.
    keys = (low[both] - low_offset - 1) * n_high + (high[both] - high_offset - 1)
    key, overlap = np.unique(keys, return_counts=True)
    pairs = np.stack([key // n_high + low_offset + 1, key % n_high + high_offset + 1], axis=1)
    mutual = (2 * overlap > sizes[pairs[:, 0]]) & (2 * overlap > sizes[pairs[:, 1]])
    return pairs[mutual]


def object_instances(
    prob: np.ndarray, params: ChannelRole | None = None, voxel_size: Sampling = None
) -> np.ndarray:
    """Objects of an object channel (mitochondria): connected foreground, optionally split.

    Foreground is ``prob > threshold``; each connected component is an object.
    With ``split``, touching objects are cut by a watershed. Without
    ``seed_threshold`` it floods the distance to the background from its maxima
    at least ``seed_distance`` apart. With it, the seeds are the connected
    cores of ``prob > seed_threshold`` at least ``seed_distance / 4`` (and 1)
    deep and it floods the probability, so two objects joined by a weaker
    bridge are cut where the bridge is faintest while one long or bent object,
    sure along its length, stays whole. A component without such a core (a
    speckled prediction's, whose cores are thin) is seeded by its shape: one
    seed per dome of its depth rising ``seed_distance / 2`` above its saddle; so
    is a dome no core reaches beside one that has a core (an unsure object
    touching a sure one). On thick sections (a z voxel at least
    :data:`~napari_finetune.voxel_size.THICK_SECTIONS` times the finest pixel) the
    shape's depth is measured within each section (:func:`_shape_depth`). A
    component with one seed or none is one object either way.

    Parameters
    ----------
    prob : (Z, Y, X) or (Y, X) array
        Probability of the object channel.
    params : ChannelRole, optional
        Threshold, min_size, split, seed_distance, seed_threshold; default
        ``ChannelRole("object")``.
    voxel_size : sequence of float, optional
        The volume's voxel size: an anisotropic one measures the distance to the
        background and ``seed_distance`` in physical units (voxels of the finest
        axis); None or isotropic: in voxels, as before.

    Returns
    -------
    np.ndarray of uint32
        Ids 1..N, 0 on background and on removed fragments.
    """
    params = params or ChannelRole("object")
    prob = _probability(prob, params, "object")
    foreground = prob > params.threshold
    regions, n_regions = _label(foreground, "objects")
    if params.split and n_regions and params.seed_threshold is not None:
        spacing = relative_sampling(voxel_size, prob.ndim)
        markers, n_markers = _deep_cores(prob > params.seed_threshold, params.seed_distance,
                                         spacing)
        surface = -prob
        markers, n_markers = _domes_where_no_core(markers, n_markers, regions,
                                                  params.seed_distance, spacing, surface)
        labels = _flood(surface, markers, n_markers, regions, n_regions)
    elif params.split and n_regions:
        spacing = relative_sampling(voxel_size, prob.ndim)
        depth = ndimage.distance_transform_edt(foreground, sampling=spacing).astype(np.float32)
        # Maxima seed_distance apart along each axis in physical units, and at least one
        # voxel: a window one section thick would make each section's middle a maximum,
        # one line of them through a thick object (seed_distance >= 1: as before without).
        size = tuple(2 * max(1, int(params.seed_distance / d)) + 1
                     for d in spacing or (1.0,) * prob.ndim)
        peaks = foreground & (depth == ndimage.maximum_filter(depth, size=size))
        # A plateau of equal maxima is one seed (label joins it), not many; joined across
        # edges and corners too: the deepest line of an object lying diagonally touches
        # its neighbours only there, and face connectivity cut it into one seed a voxel.
        markers, n_markers = _label(peaks, "seeds", full=True)
        labels = _flood(-depth, markers, n_markers, regions, n_regions)
    else:
        labels = regions
    return _keep_big(labels, params.min_size)


def instances_of(
    probabilities: np.ndarray,
    roles: Mapping[str, ChannelRole],
    channel_names: Sequence[str],
    voxel_size: Sampling = None,
) -> dict[str, np.ndarray]:
    """Instance labels of every channel with a role, by channel name.

    Parameters
    ----------
    probabilities : (C, Z, Y, X) or (C, Y, X) array
    roles : channel name -> ChannelRole
        (:func:`napari_finetune.objects.roles_from_metadata`).
    channel_names : the C names, in channel order.
    voxel_size : the volume's voxel size, optional (see :func:`boundary_instances`).
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
        out[name] = make(prob, role, voxel_size)
    return out
