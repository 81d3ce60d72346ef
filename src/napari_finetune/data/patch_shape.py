"""The patch a run trains on, fitted to the image and the model: one rule for every front end.

The configured patch (``FinetuneConfig.patch_shape``, 3D by default) meets
images of either dimensionality and models with their own pooling multiple.
The CLI fits the default patch and the widget fits the patch of its form
through :func:`fit_patch_shape`, so both train a given image on the same patch.
"""

from __future__ import annotations

from collections.abc import Sequence

# The patch of a 2D image when the configured one has three axes (the default's).
DEFAULT_2D_PATCH = (128, 128)


def fit_patch_shape(
    patch: Sequence[int], shape: Sequence[int], multiple: int = 1
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
    multiple : int
        The model's input multiple (``2**depth`` for the UNet); every size is at
        least one multiple.
    """
    patch = tuple(int(p) for p in patch)
    if len(patch) > len(shape):
        patch = DEFAULT_2D_PATCH[-len(shape):] if len(shape) <= 2 else patch[-len(shape):]
    if len(patch) < len(shape):
        patch = (patch[0],) * (len(shape) - len(patch)) + patch
    return tuple(
        max(min(p, int(s)) // multiple * multiple, multiple)
        for p, s in zip(patch, shape, strict=True)
    )
