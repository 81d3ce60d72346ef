"""Labels images that carry their image's pyramid, written block by block.

NGFF requires a labels image to have as many resolution levels as its image
(ome-zarr-models rejects a store where they differ), and viewers overlay each
labels level on the image level of the same index. So a labels image made
here copies the image's levels: the same shapes and the same per-level
coordinate transforms (scale, and translation where the image has one). Its
arrays are ``s0``, ``s1``, ... over the image's spatial axes.

Level ``k`` is filled from level ``k - 1`` by nearest-neighbour sampling: each
voxel takes the value of the source voxel whose centre is nearest its own, in
the physical coordinates the transforms give (labels must never be averaged:
the mean of classes 1 and 3 is not class 2). The work goes one output chunk
at a time, reading only the source region under that chunk, so memory stays
at a few chunks whatever the volume's size.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from napari_finetune.arrays import VolumeArray
from napari_finetune.io.ngff import ngff_format
from napari_finetune.io.volume import Volume, VolumeError, compose_transforms

if TYPE_CHECKING:  # zarr is imported where a store is opened
    import zarr

# Largest chunk a labels level gets (voxels): what one block of the writing holds in
# memory, a few times over. An image stored as one big chunk would otherwise make
# the labels one big chunk too.
MAX_CHUNK_VOXELS = 2**21
STORE_THREADS = 4


def bounded_chunks(chunks: tuple[int, ...], max_voxels: int = MAX_CHUNK_VOXELS) -> tuple[int, ...]:
    """``chunks`` with the longest side halved until a chunk holds at most ``max_voxels``."""
    out = [max(int(c), 1) for c in chunks]
    while int(np.prod(out)) > max_voxels and max(out) > 1:
        longest = out.index(max(out))
        out[longest] = (out[longest] + 1) // 2
    return tuple(out)


def axes_meta(volume: Volume) -> list[dict[str, str]]:
    """NGFF axes of the volume's labels: its spatial axes, after its time axis if it has
    one (labels have no channel axis: one value per voxel)."""
    axes = []
    for a in volume.axes:
        entry = {"name": a, "type": "time" if a == "t" else "space"}
        if a in volume.axis_units:
            entry["unit"] = volume.axis_units[a]
        axes.append(entry)
    return axes


def level_transforms(volume: Volume, level: int) -> list[dict[str, Any]]:
    """The image's composed transforms of ``level``, so labels overlay it in every viewer."""
    transforms: list[dict[str, Any]] = [{"type": "scale", "scale": list(volume.scale[level])}]
    if any(volume.translation[level]):
        transforms.append({"type": "translation", "translation": list(volume.translation[level])})
    return transforms


def create_pyramid(
    parent: zarr.Group,
    name: str,
    volume: Volume,
    dtype: npt.DTypeLike,
    chunks: tuple[int, ...],
    image_label: dict[str, Any],
) -> zarr.Group:
    """Create ``<parent>/<name>``: one zero-filled array per image level, with its metadata.

    Parameters
    ----------
    parent : zarr.Group
        The ``labels`` group (of the store, or of a staging folder).
    name : str
        The labels image's name.
    volume : Volume
        The image whose levels are copied.
    dtype : dtype
        Integer dtype of every level.
    chunks : tuple of int
        Level-0 chunks; smaller levels use the same, clipped to their shape.
    image_label : dict
        NGFF ``image-label`` entries (``colors``, ``properties``, ``source``).

    Returns
    -------
    zarr.Group
        The new labels image; ``group["s0"]`` is level 0.
    """
    from ome_zarr.writer import write_label_metadata, write_multiscales_metadata

    fmt = ngff_format(volume.zarr_format)
    group = parent.create_group(name)
    kwargs: dict[str, Any] = {}
    if fmt.zarr_format == 2:
        kwargs["chunk_key_encoding"] = {"name": "v2", "separator": "/"}  # NGFF 0.4 wants "/"
    else:
        kwargs["dimension_names"] = list(volume.axes)
    datasets = []
    for level, data in enumerate(volume.levels):
        shape = tuple(int(s) for s in data.shape)
        group.create_array(
            f"s{level}",
            shape=shape,
            dtype=dtype,
            chunks=tuple(min(c, s) for c, s in zip(chunks, shape, strict=True)),
            fill_value=0,
            **kwargs,
        )
        datasets.append(
            {"path": f"s{level}", "coordinateTransformations": level_transforms(volume, level)}
        )
    write_multiscales_metadata(group, datasets=datasets, fmt=fmt, axes=axes_meta(volume),
                               name=name)
    write_label_metadata(parent, name, fmt=fmt, **image_label)
    return group


def nearest_indices(
    n_dst: int, n_src: int, dst: tuple[float, float], src: tuple[float, float]
) -> np.ndarray:
    """For each of ``n_dst`` voxels along one axis, the index of the nearest source voxel.

    ``dst`` and ``src`` are (scale, translation) along that axis. Where their
    ratio disagrees with the shapes' by more than a quarter (metadata that does
    not describe the arrays, e.g. the same scale at every level), the shapes
    decide: the levels are taken to span the same extent.
    """
    by_shape = n_src / n_dst
    step = dst[0] / src[0] if src[0] > 0 else 0.0
    # Odd sizes make the two ratios differ a little (65 -> 33 is 1.97, not 2).
    if abs(step / by_shape - 1.0) <= 0.25:
        centres = (dst[1] - src[1]) / src[0] + np.arange(n_dst) * step
    else:
        centres = (np.arange(n_dst) + 0.5) * by_shape - 0.5
    # floor(x + 0.5): halves round up, the same way on every platform.
    return np.clip(np.floor(centres + 0.5), 0, n_src - 1).astype(np.intp)


def chunk_blocks(shape: tuple[int, ...], chunks: tuple[int, ...]) -> Iterator[tuple[slice, ...]]:
    """The chunk grid of an array, one tuple of slices per chunk."""
    ranges = [range(0, s, c) for s, c in zip(shape, chunks, strict=True)]
    for starts in itertools.product(*ranges):
        yield tuple(
            slice(a, min(a + c, s)) for a, c, s in zip(starts, chunks, shape, strict=True)
        )


def downsample_level(
    src: zarr.Array, dst: zarr.Array, src_geometry: list[tuple[float, float]],
    dst_geometry: list[tuple[float, float]],
) -> None:
    """Fill ``dst`` from ``src`` (zarr arrays) by nearest neighbour, one chunk of ``dst`` at a time.

    ``*_geometry`` give (scale, translation) per axis.
    """
    maps = [
        nearest_indices(int(n_dst), int(n_src), d, s)
        for n_dst, n_src, d, s in zip(dst.shape, src.shape, dst_geometry, src_geometry,
                                      strict=True)
    ]
    for block in chunk_blocks(tuple(dst.shape), tuple(dst.chunks)):
        picks = [m[b] for m, b in zip(maps, block, strict=True)]
        # The indices are sorted, so the source region under this chunk is one box.
        box = tuple(slice(int(p[0]), int(p[-1]) + 1) for p in picks)
        region = np.asarray(src[box])
        dst[block] = region[np.ix_(*[p - p[0] for p in picks])]


def level_array(group: zarr.Group, path: str) -> zarr.Array:
    """The level ``path`` of a multiscale image (an array; a group there is damage)."""
    import zarr

    array = group[path]
    if not isinstance(array, zarr.Array):
        raise VolumeError(
            f"{group.path}/{path} is a group, not a level array; the labels image is "
            "damaged: save the labels again."
        )
    return array


def fill_pyramid(group: zarr.Group) -> None:
    """Recompute levels 1, 2, ... of a multiscale labels image from its level 0.

    Parameters
    ----------
    group : zarr.Group
        A labels image (NGFF ``multiscales``), opened for writing, whose
        level 0 is written.
    """
    # NGFF metadata: JSON whose layout the spec fixes, read as plain dicts and lists.
    attrs: dict[str, Any] = group.attrs.asdict()
    multiscale = attrs.get("ome", attrs)["multiscales"][0]
    outer = multiscale.get("coordinateTransformations") or []
    arrays: list[zarr.Array] = []
    geometry: list[list[tuple[float, float]]] = []
    for dataset in multiscale["datasets"]:
        array = level_array(group, dataset["path"])
        scale, translation = compose_transforms(
            list(dataset.get("coordinateTransformations") or []) + list(outer), array.ndim
        )
        arrays.append(array)
        geometry.append(list(zip(scale, translation, strict=True)))
    for level in range(1, len(arrays)):
        downsample_level(arrays[level - 1], arrays[level], geometry[level - 1], geometry[level])


def write_level0(array: zarr.Array, data: VolumeArray) -> None:
    """Store ``data`` (numpy, dask or zarr) into level 0, one of its chunks at a time."""
    import dask.array as da

    lazy = data if isinstance(data, da.Array) else da.from_array(data, chunks=array.chunks)
    lazy = lazy.astype(array.dtype).rechunk(array.chunks)
    # Each dask block is one whole zarr chunk: no two writers touch the same chunk. A
    # few threads only: each holds a chunk or three, on a 64-core machine too.
    # dask types store()'s targets as array-likes; it only writes them by slices, which
    # a zarr array takes.
    da.store(lazy, array, lock=False, scheduler="threads",  # type: ignore[arg-type]
             num_workers=min(STORE_THREADS, os.cpu_count() or 1))
