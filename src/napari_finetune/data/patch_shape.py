"""The patch a run trains on, fitted to the image and the model: one rule for every front end.

The configured patch (``FinetuneConfig.patch_shape``, 3D by default) meets
images of either dimensionality and models with their own pooling multiple.
The CLI fits the default patch and the widget fits the patch of its form
through :func:`fit_patch_shape`, so both train a given image on the same patch.

With an anisotropic voxel size (``FinetuneConfig.voxel_size``) the patch keeps
about the configured number of voxels but is shaped to be about as long on
every axis in physical units (:func:`isotropic_patch`): on 40 x 8 x 8 nm
ssTEM the default 32 x 64 x 64 would cover 1280 x 512 x 512 nm, mostly z
context the model's xy-sized kernels barely relate; 16 x 88 x 88 covers
640 x 704 x 704 nm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from napari_finetune.voxel_size import for_axes, is_anisotropic

# The patch of a 2D image when the configured one has three axes (the default's).
DEFAULT_2D_PATCH = (128, 128)


def fit_patch_shape(
    patch: Sequence[int], shape: Sequence[int], multiple: int | Sequence[int] = 1,
    voxel_size: Sequence[float] | None = None,
) -> tuple[int, ...]:
    """``patch`` for an image of ``shape``, cut to it and kept a multiple of the model's pooling.

    Parameters
    ----------
    patch : sequence of int
        The configured patch. With more axes than the image (the 3D default on a
        2D image) it becomes :data:`DEFAULT_2D_PATCH`; with fewer, its first size
        is repeated.
    shape : sequence of int
        The image's spatial shape.
    multiple : int or sequence of int
        The model's input multiple (``2**depth`` for the UNet), one for every
        axis or one per axis; every size is at least one multiple.
    voxel_size : sequence of float, optional
        The image's voxel size; an anisotropic one reshapes the patch
        (:func:`isotropic_patch`). None or isotropic: the patch as configured.
    """
    patch = tuple(int(p) for p in patch)
    if len(patch) > len(shape):
        patch = DEFAULT_2D_PATCH[-len(shape):] if len(shape) <= 2 else patch[-len(shape):]
    if len(patch) < len(shape):
        patch = (patch[0],) * (len(shape) - len(patch)) + patch
    multiples = (multiple,) * len(shape) if isinstance(multiple, int) else tuple(multiple)
    sizes = for_axes(voxel_size, len(shape))
    if sizes is not None and is_anisotropic(sizes):
        return isotropic_patch(math.prod(patch), shape, multiples, sizes)
    return tuple(
        max(min(p, int(s)) // m * m, m) for p, s, m in zip(patch, shape, multiples, strict=True)
    )


def isotropic_patch(
    voxels: int, shape: Sequence[int], multiple: Sequence[int], voxel_size: Sequence[float]
) -> tuple[int, ...]:
    """A patch of about ``voxels`` voxels as long on every axis in physical units.

    Each axis gets ``edge / voxel_size`` voxels for the edge that makes the
    product ``voxels``, rounded to the nearest multiple of the model's pooling
    on that axis (at least one) and cut to the image; an axis cut by the image
    gives its share to the others, so a thin stack still trains on wide patches.

    Parameters
    ----------
    voxels : int
        The voxel budget (the configured patch's voxel count).
    shape : sequence of int
        The image's spatial shape.
    multiple : sequence of int
        The model's input multiple per axis.
    voxel_size : sequence of float
        The image's voxel size, one per axis.
    """
    free = list(range(len(shape)))
    sizes = [0.0] * len(shape)
    budget = float(voxels)
    while free:  # axes cut by the image leave the loop, their share to the rest
        edge = (budget * math.prod(voxel_size[a] for a in free)) ** (1 / len(free))
        cut = [a for a in free if edge / voxel_size[a] > shape[a]]
        if not cut:
            for a in free:
                sizes[a] = edge / voxel_size[a]
            break
        for a in cut:
            sizes[a] = float(shape[a])
            budget /= shape[a]
            free.remove(a)
    return tuple(
        max(min(round(size / m) * m, int(s) // m * m), m)
        for size, s, m in zip(sizes, shape, multiple, strict=True)
    )
