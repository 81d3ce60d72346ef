"""How a volume is cut for prediction: cores, reads with their halo, regions, chunk alignment.

One module for every tiling question of the prediction paths:

- :func:`block_grid` (in memory, :func:`~napari_finetune.predict.predict_volume`):
  the fewest blocks, border cores widened (:func:`axis_cores`);
- :func:`region_grid` (into a store, in process or on a cluster): cores of one
  fixed shape from an origin, so each core is whole output chunks;
- :func:`read_span`: the read (core + halo, clipped, on the model's pooling
  grid) and where the core lies inside it, shared by both;
- :func:`chunk_aligned_block`: a region shape that is a whole number of the
  output array's chunks, so no two regions ever write the same chunk (what
  makes concurrent writers safe without locks);
- :func:`smaller_block`: the next block size down after running out of memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def read_span(start: int, stop: int, size: int, halo: int, multiple: int) -> tuple[slice, slice]:
    """(read, inner) of one axis: core ``[start, stop)`` plus ``halo``, clipped to ``size``,
    starting and ending on the ``multiple`` grid (so pooling windows match a one-shot call)."""
    lo = max(0, start - halo) // multiple * multiple
    hi = min(size, lo + -(-(stop + halo - lo) // multiple) * multiple)
    return slice(lo, hi), slice(start - lo, stop - lo)


def axis_cores(size: int, block: int, halo: int, multiple: int = 1) -> list[tuple[int, int]]:
    """Cut one axis into cores whose reads (core + halo) stay within ``block + 2 * halo``.

    Border blocks have a halo on one side only, so their cores may reach
    ``block + halo``: the fewest blocks are used, interior cores are ``block``
    and the two border cores share the rest (no thin leftover block that costs
    a whole halo for a few voxels of output; an axis that fits is one block).
    """
    n = max(1, -(-(size - 2 * halo) // block))
    if n == 1:
        return [(0, size)]
    rest = size - (n - 2) * block
    first = max(1, rest // 2 // multiple * multiple) if rest // 2 >= multiple else rest // 2
    edges = [0, first] + [first + k * block for k in range(1, n - 1)] + [size]
    return list(zip(edges[:-1], edges[1:], strict=True))


def block_grid(
    shape: Sequence[int],
    block_shape: Sequence[int],
    halo: Sequence[int],
    multiple: int | Sequence[int] = 1,
) -> list[tuple[tuple[slice, ...], tuple[slice, ...], tuple[slice, ...]]]:
    """Cut ``shape`` into blocks (see :func:`axis_cores`).

    Returns
    -------
    list of (core, read, inner)
        ``core``: the slices of the volume this block writes; ``read``: the
        slices read (:func:`read_span`, ``multiple`` one int or one per axis);
        ``inner``: where the core lies inside the read block.
    """
    multiples = (multiple,) * len(shape) if isinstance(multiple, int) else tuple(multiple)
    axes = []
    for size, b, h, m in zip(shape, block_shape, halo, multiples, strict=True):
        spans = []
        for start, stop in axis_cores(size, b, h, m):
            read, inner = read_span(start, stop, size, h, m)
            spans.append((slice(start, stop), read, inner))
        axes.append(spans)
    grid: list[tuple[tuple[slice, ...], tuple[slice, ...], tuple[slice, ...]]] = []
    for combo in itertools.product(*axes):
        grid.append((
            tuple(part[0] for part in combo),
            tuple(part[1] for part in combo),
            tuple(part[2] for part in combo),
        ))
    return grid


def region_grid(
    shape: Sequence[int], block: Sequence[int], origin: Sequence[int] | None = None,
    stop: Sequence[int] | None = None,
) -> list[tuple[slice, ...]]:
    """Cores of ``block`` from ``origin`` (default 0) to ``stop`` (default ``shape``)."""
    origin = origin or [0] * len(shape)
    stop = stop or list(shape)
    axes = [
        [slice(a, min(a + b, e)) for a in range(o, e, b)]
        for o, e, b in zip(origin, stop, block, strict=True)
    ]
    return [tuple(c) for c in itertools.product(*axes)]


def chunk_aligned_block(block: Sequence[int], chunks: Sequence[int]) -> tuple[int, ...]:
    """``block`` rounded up, per axis, to a whole number of ``chunks``.

    Regions of this shape from the origin (:func:`region_grid`) start on chunk
    boundaries and end on one or at the array's end, so every chunk lies in
    exactly one region.
    """
    return tuple(-(-int(b) // int(c)) * int(c) for b, c in zip(block, chunks, strict=True))


def smaller_block(block: Sequence[int], multiple: int | Sequence[int]) -> tuple[int, ...] | None:
    """Halve the largest axes (not below ``multiple``, one int or one per axis); None when
    nothing shrinks."""
    multiples = (multiple,) * len(block) if isinstance(multiple, int) else tuple(multiple)
    top = max(block)
    new = tuple(
        max(m, -(-b // 2)) if b == top else b for b, m in zip(block, multiples, strict=True)
    )
    return None if new == tuple(block) else new
