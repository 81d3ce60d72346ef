"""Instance labels of a whole volume, block by block, with one id per object.

:func:`blockwise_instances` reads one channel's probability one block (plus a
halo) at a time and writes uint32 labels into an array of the volume's shape
(a zarr array in a store, or numpy). Memory is bounded by the block and what
the merge needs, never by the volume:

1. Every core block is labelled from its halo'd view (``min_size`` deferred,
   see below); its ids are offset by the ids used so far, so they are unique
   across blocks, and its core is written. Its voxel count per id is kept, and
   the faces it shares with the blocks after it (one slice of its core and one
   of its halo) until those blocks are labelled.
2. Ids meeting across each shared face are linked:

   * object channels without ``split``: two foreground voxels facing each
     other across the face are one object (6-connected, as ``ndimage.label``),
     so the result equals the one-piece labels exactly and no halo is read;
   * boundary channels and split objects (their labels depend on context: a
     seed's depth, the nearest seed, a distance transform): each block's
     halo sees one slice of its neighbour's core. Every id on a core face is
     linked to the id the neighbour's view gives most of its voxels there
     (the "halo agreement"), both ways.

3. Linked ids form the connected components of a graph over the block-local
   ids (``scipy.sparse.csgraph``); components smaller than ``min_size``
   voxels (summed over their blocks) are dropped, the others numbered
   1..N, and a second pass over the blocks rewrites the labels.

``min_size`` is applied to whole objects, never to the piece one block sees:
per block it would remove the small end of a large object crossing a border.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import sparse
from scipy.sparse.csgraph import connected_components

from napari_finetune.arrays import VolumeArray, WritableVolume
from napari_finetune.objects import segment
from napari_finetune.objects.roles import ChannelRole
from napari_finetune.voxel_size import thick_sections

Progress = Callable[[int, int], None]


def default_halo(params: ChannelRole, ndim: int,
                 voxel_size: Sequence[float] | None = None) -> tuple[int, ...]:
    """Halo (voxels per side) that gives a block's core the context its labels depend on.

    None for plain connected components (object, no split): they are merged
    exactly across faces. Otherwise a multiple of the seed distance, even (the
    boundary role seeds on a 2x coarser grid that must stay aligned to the
    volume's). Boundary: six. A seed is a depth maximum at least
    ``seed_distance`` deep, and whether a bump is a second maximum depends on
    the saddle next to it, so a block must see the middles of the cells
    crossing its core: with four (32 voxels for the sample's 8) 5 of the
    sample's 60 one-piece cells differed at the default block (two pairs
    joined), with six 0 (and 0 of 65, 52, 39 on three other predictions).

    Split at probability cores (``seed_threshold``): a voxel belongs to the
    core its flood reaches first, along a path inside its own object, so a
    block whose read region holds every object that meets its core (and the
    one voxel around it the join reads) labels those voxels as the one piece
    does, up to ties in the probability, and the halo agreement joins them
    exactly. That holds for objects reaching less than the halo past a
    block's core: 16 voxels for the sample's 4. No role value bounds an
    object's length, so a longer object crossing a border may be cut from
    what one block sees. The halo's cost is small next to the watershed of
    the components with several cores (docs/benchmarks.md, "Blockwise over
    the whole volume").

    Boundary on thick sections (``voxel_size``,
    :func:`~napari_finetune.voxel_size.thick_sections`): 2 along z. Each
    section's cells are made alone, and whether a cell links to one on the next
    section depends on those two sections alone, so one section past the core
    (what the join reads) is all a block needs along z; more would be labelled
    and thrown away. Even, as the others.
    """
    if params.role == "object" and not params.split:
        return (0,) * ndim
    times = 6 if params.role == "boundary" else 4
    h = max(4, math.ceil(times * params.seed_distance))
    halo = (h + h % 2,) * ndim
    if params.role == "boundary" and thick_sections(voxel_size, ndim):
        return (2, *halo[1:])
    return halo


def block_cores(shape: Sequence[int], block: Sequence[int]) -> Iterator[tuple[tuple[int, ...],
                                                                         tuple[slice, ...]]]:
    """(block index, core slices) of every block, in C order."""
    ranges = [range(0, n, b) for n, b in zip(shape, block, strict=True)]
    for starts in itertools.product(*ranges):
        index = tuple(s // b for s, b in zip(starts, block, strict=True))
        core = tuple(slice(s, min(s + b, n)) for s, b, n in zip(starts, block, shape, strict=True))
        yield index, core


def _check_args(prob: VolumeArray, out: WritableVolume, params: ChannelRole, block: Sequence[int],
                halo: Sequence[int]) -> None:
    if params.role is None:
        raise ValueError("this channel has no instance role; give it 'boundary' or 'object'.")
    params.validate()
    shape = tuple(prob.shape)
    if len(shape) not in (2, 3):
        raise ValueError(f"expected one channel's (Y, X) or (Z, Y, X) probability, got {shape}.")
    if tuple(out.shape) != shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from the probability's {shape}.")
    if np.dtype(out.dtype) != np.uint32:
        raise ValueError(f"output dtype is {out.dtype}; instance labels are written as uint32.")
    if len(block) != len(shape) or any(int(b) < 1 for b in block):
        raise ValueError(f"block shape {tuple(block)} needs one size >= 1 per axis of {shape}.")
    if len(halo) != len(shape) or any(int(h) < 0 for h in halo):
        raise ValueError(f"halo {tuple(halo)} needs one size >= 0 per axis of {shape}.")
    if params.role == "boundary" or params.split:
        if any(int(h) < 1 for h, n, b in zip(halo, shape, block, strict=True) if n > b):
            raise ValueError(
                f"halo {tuple(halo)}: a {params.role} channel"
                f"{' with split' if params.split else ''} needs a halo of at least 1 voxel "
                "along every axis split into blocks (default_halo gives one)."
            )


def _read_box(core: tuple[slice, ...], halo: Sequence[int], shape: Sequence[int],
              even: bool) -> tuple[slice, ...]:
    box = []
    for c, h, n in zip(core, halo, shape, strict=True):
        start = max(0, c.start - h)
        if even and start % 2:  # keep the boundary role's 2x coarse grid on the volume's
            start -= 1
        box.append(slice(start, min(n, c.stop + h)))
    return tuple(box)


def _adjacent_links(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """(k, 2) pairs of ids facing each other across a face, both foreground."""
    both = (low > 0) & (high > 0)
    if not both.any():
        return np.empty((0, 2), np.int64)
    return np.unique(np.stack([low[both], high[both]], axis=1).astype(np.int64), axis=0)


def blockwise_instances(
    prob: VolumeArray,
    params: ChannelRole,
    block_shape: Sequence[int],
    out: WritableVolume,
    halo: Sequence[int] | None = None,
    progress: Progress | None = None,
    voxel_size: Sequence[float] | None = None,
) -> int:
    """Instance labels of a whole volume into ``out``, computed block by block.

    The result equals :func:`~napari_finetune.objects.instances_of` on the
    whole volume up to the numbering of the ids, exactly for object channels
    without ``split``, and for objects split at probability cores that reach
    less than the halo past a block (:func:`default_halo`). For boundary
    channels (and other split objects) a block sees
    its halo, not the volume: where a region's seeds or its connection lie
    beyond the halo, the cut between two regions, or whether two regions joined
    through a gap are one, can differ. Which voxels are instances (before
    ``min_size``) is the same.

    A boundary channel on thick sections (made section by section and linked
    across z, :func:`~napari_finetune.objects.boundary_instances`) is split
    along z exactly: a block and the one above it make the same cells on the
    sections both see (the same (Y, X) box) and decide each link between two
    sections from those two alone, so the chains they see are joined into the
    whole volume's. Along y and x the cells are a 2D image's, with the caveat
    above; there a cell cut by a block's view can also gain or lose a link (its
    overlap with the next section's is counted within the view).

    Parameters
    ----------
    prob : array-like, (Z, Y, X) or (Y, X)
        One channel's probability; read by slices (numpy, zarr, dask), one
        block plus halo at a time, never whole.
    params : ChannelRole
        The channel's role and parameters.
    block_shape : sequence of int
        Core block per axis (the output's chunks, or a multiple, write whole
        chunks).
    out : array-like
        uint32, ``prob``'s shape, written by slices (zarr or numpy). Read back
        block by block in the second pass.
    halo : sequence of int, optional
        Default :func:`default_halo`.
    progress : callable, optional
        ``progress(done, total)`` after each block of either pass (total is
        twice the number of blocks).
    voxel_size : sequence of float, optional
        The volume's voxel size: distances in physical units when anisotropic
        (:func:`~napari_finetune.objects.boundary_instances`), and thick sections
        made one by one. The halo stays in voxels: on the coarse axis it is then
        more context than needed, not less (:func:`default_halo` gives thick
        sections one of 2 along z).

    Returns
    -------
    int
        The number of instances N (ids 1..N).

    Raises
    ------
    ValueError
        One line: bad arguments, or more ids than uint32 holds.
    """
    shape = tuple(int(s) for s in prob.shape)
    block = tuple(int(b) for b in block_shape)
    halo = (default_halo(params, len(shape), voxel_size) if halo is None
            else tuple(int(h) for h in halo))
    _check_args(prob, out, params, block, halo)
    cores = list(block_cores(shape, block))
    total = 2 * len(cores)
    joiner = FaceJoiner(shape, contextual(params))
    for done, (index, core) in enumerate(cores, start=1):
        labelled = label_block(prob, params, core, halo, voxel_size)
        offset = joiner.add(index, core, labelled)
        out[core] = with_offset(labelled.core_ids, offset).astype(np.uint32)
        if progress is not None:
            progress(done, total)

    lut = joiner.final_ids(params.min_size)
    n = int(lut.max(initial=0))
    for done, (_, core) in enumerate(cores, start=len(cores) + 1):
        out[core] = lut[np.asarray(out[core])]
        if progress is not None:
            progress(done, total)
    return n


def contextual(params: ChannelRole) -> bool:
    """Whether a block's labels depend on context (halo agreement), not only its voxels."""
    return params.role == "boundary" or bool(params.split)


def with_offset(ids: np.ndarray, offset: int) -> np.ndarray:
    """Block-local ids moved up by ``offset`` (int64; the background stays 0)."""
    ids = ids.astype(np.int64)
    ids[ids > 0] += offset
    return ids


@dataclass
class LabelledBlock:
    """One block's labels, in its own ids 1..n, and what the join needs of it.

    Attributes
    ----------
    n : int
        Local ids 1..n.
    sizes : ndarray of int64, (n,)
        Core voxels per local id.
    lower, upper : dict of int to ndarray
        Per axis with a neighbour below (above): the slab across that face
        (:func:`blockwise_instances`' module doc), in local ids.
    core_ids : ndarray of uint32
        The core's local ids.
    """

    n: int
    sizes: np.ndarray
    lower: dict[int, np.ndarray]
    upper: dict[int, np.ndarray]
    core_ids: np.ndarray


def label_block(prob: VolumeArray, params: ChannelRole, core: tuple[slice, ...],
                halo: Sequence[int], voxel_size: Sequence[float] | None = None) -> LabelledBlock:
    """Label one core block from its halo'd view of ``prob`` (``min_size`` deferred: it
    counts whole objects), reading only that view."""
    shape = tuple(int(s) for s in prob.shape)
    ctx = contextual(params)
    label = segment.boundary_instances if params.role == "boundary" else segment.object_instances
    box = _read_box(core, halo if ctx else (0,) * len(shape), shape,
                    even=params.role == "boundary")
    local = label(np.asarray(prob[box], dtype=np.float32), replace(params, min_size=0),
                  voxel_size)
    n_local = int(local.max(initial=0))
    inner = tuple(slice(c.start - b.start, c.stop - b.start)
                  for c, b in zip(core, box, strict=True))
    core_ids = np.asarray(local[inner], dtype=np.uint32)

    def slab(axis: int, start: int, stop: int) -> np.ndarray:
        where = list(inner)
        where[axis] = slice(start, stop)
        return np.array(local[tuple(where)], dtype=np.uint32)

    lower, upper = {}, {}
    for axis in range(len(shape)):
        lo, hi = inner[axis].start, inner[axis].stop
        if core[axis].start > 0:  # [lower's last core slice (my halo), my first] or my first
            lower[axis] = slab(axis, lo - 1, lo + 1) if ctx else slab(axis, lo, lo + 1)
        if core[axis].stop < shape[axis]:  # [my last core slice, upper's first (my halo)]
            upper[axis] = slab(axis, hi - 1, hi + 1) if ctx else slab(axis, hi - 1, hi)
    sizes = np.bincount(core_ids[core_ids > 0].ravel(), minlength=n_local + 1)[1:]
    return LabelledBlock(n_local, sizes.astype(np.int64), lower, upper, core_ids)


class FaceJoiner:
    """Block ids offset and joined across faces, blocks added in C order (module doc, 1-3).

    Holds the ids used so far, each id's core voxels, the links found, and the
    upper faces of the blocks added until their upper neighbour comes.
    """

    def __init__(self, shape: Sequence[int], contextual: bool) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.contextual = contextual
        self.used = 0  # ids handed out so far
        self.sizes: list[np.ndarray] = [np.zeros(1, np.int64)]  # id 0 first
        self.links: list[np.ndarray] = []
        self.waiting: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}

    def add(self, index: tuple[int, ...], core: tuple[slice, ...],
            block: LabelledBlock) -> int:
        """Join the next block (C order); return the offset of its ids.

        Raises a one-line ValueError when the ids would overflow uint32.
        """
        offset = self.used
        if offset + block.n > segment.MAX_ID:
            raise ValueError(
                f"more than {segment.MAX_ID} provisional ids would overflow uint32 labels; "
                "raise min_size/seed_distance or use larger blocks."
            )
        self.sizes.append(np.asarray(block.sizes, np.int64))
        for axis in range(len(self.shape)):
            if axis in block.lower:
                lower = self.waiting.pop((axis, tuple(index)))
                self.links.extend(self._join(axis, lower, with_offset(block.lower[axis],
                                                                      offset)))
            if axis in block.upper:
                upper = list(index)
                upper[axis] += 1
                self.waiting[(axis, tuple(upper))] = with_offset(block.upper[axis], offset)
        self.used += block.n
        return offset

    def _join(self, axis: int, lower: np.ndarray, mine: np.ndarray) -> list[np.ndarray]:
        if not self.contextual:
            return [_adjacent_links(lower, mine)]
        lower_core, lower_view = (np.take(lower, [k], axis=axis) for k in (0, 1))
        my_view, my_core = (np.take(mine, [k], axis=axis) for k in (0, 1))
        return [segment.majority_links(lower_core, my_view),  # its core, as I see it
                segment.majority_links(my_core, lower_view)]  # my core, as it sees it

    def final_ids(self, min_size: int) -> np.ndarray:
        """Provisional id -> final id 1..N (uint32; 0 for the background, small objects)."""
        return _final_ids(self.used, np.concatenate(self.sizes), self.links, min_size)


def _final_ids(used: int, sizes: np.ndarray, links: list[np.ndarray],
               min_size: int) -> np.ndarray:
    """Provisional id -> final id (uint32; 0 for the background and for small objects)."""
    pairs = np.concatenate(links) if links else np.empty((0, 2), np.int64)
    graph = sparse.coo_matrix(
        (np.ones(len(pairs), np.int8), (pairs[:, 0], pairs[:, 1])), shape=(used + 1, used + 1)
    )
    _, component = connected_components(graph, directed=False)
    # Components are numbered from node 0 up, so objects keep roughly the scan order.
    voxels = np.bincount(component, weights=sizes, minlength=component.max() + 1)
    keep = voxels >= max(min_size, 1)
    keep[component[0]] = False  # the background's component (node 0 is linked to nothing)
    final = np.zeros(keep.size, np.uint32)
    final[keep] = np.arange(1, int(keep.sum()) + 1, dtype=np.uint32)
    return final[component]
