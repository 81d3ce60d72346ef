"""Deterministic fluorescence-like volumes with truth: bright nuclei, or bright-membrane cells.

The other half of the starter model's synthetic family (:mod:`.starter`; the first
half is the EM generator, :mod:`.synthetic_em`). Geometry is drawn on an isotropic
grid ``anisotropy`` times finer in z than the volume returned, blurred there by an
anisotropic point-spread function (longer in z, as a widefield or confocal PSF is),
then every ``anisotropy``-th slice is kept: the voxels come out ``anisotropy`` times
coarser in z than in y and x, as in most fluorescence stacks. Photon (Poisson) noise
at a random brightness, read noise, a random offset and gain, and on request inverted
contrast.

Truth: one mask per channel of :data:`CHANNEL_NAMES`, which may overlap (the model
has one sigmoid per channel): ``boundaries`` are the cells' membranes or the nuclei's
outer rims, ``objects`` the nuclei, whole. A ``cells`` volume has no objects: a
cell enclosed by a bright membrane is not a bright object.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from napari_finetune.samples.synthetic_em import _smooth_noise

CHANNEL_NAMES = ["boundaries", "objects"]
KINDS = ("nuclei", "cells")
Kind = Literal["nuclei", "cells"]
# Bump whenever the output for given arguments changes.
GENERATOR_VERSION = 1

RIM = 1.5  # voxels (in y-x units): the outer shell of a nucleus that is its boundary


def generate_fluo_volume(
    shape: tuple[int, int, int],
    seed: int,
    kind: Kind = "nuclei",
    anisotropy: int = 1,
    inverted: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """One fluorescence-like volume and its per-channel truth.

    Parameters
    ----------
    shape : (z, y, x)
        Of the returned volume; each >= 4 (z) and >= 16 (y, x).
    seed : int
        Everything (geometry, optics, noise) follows from it.
    kind : {"nuclei", "cells"}
        Bright textured nuclei (ellipsoids of varied size and flatness, some
        touching) on a dark background, or cells outlined by bright membranes.
    anisotropy : int
        How many times coarser z is than y and x (1 to 8).
    inverted : bool
        Dark structures on a bright background (the same truth).

    Returns
    -------
    image : np.ndarray of uint8, ``shape``
    truth : np.ndarray of bool, (2, *shape)
        ``truth[0]`` boundaries, ``truth[1]`` objects.
    """
    from scipy import ndimage

    shape = _check(shape, kind, anisotropy)
    rng = np.random.default_rng([int(seed), KINDS.index(kind), anisotropy, 0xF1])
    fine = (shape[0] * anisotropy, shape[1], shape[2])
    if kind == "nuclei":
        grey, boundaries, objects = _nuclei(rng, fine, anisotropy)
    else:
        grey, boundaries, objects = _cells(rng, fine)
    # The PSF: a few voxels wide in y-x, two to four times longer along the optical axis.
    sigma_xy = rng.uniform(0.7, 2.0)
    grey = ndimage.gaussian_filter(grey, (sigma_xy * rng.uniform(2.0, 4.0), sigma_xy, sigma_xy))
    # One slice of every ``anisotropy``: the stack's z step.
    offset = int(rng.integers(anisotropy))
    keep = slice(offset, offset + shape[0] * anisotropy, anisotropy)
    grey, boundaries, objects = grey[keep], boundaries[keep], objects[keep]
    # Photon noise at a random brightness (few photons: grainy), then read noise.
    peak = float(np.exp(rng.uniform(np.log(4.0), np.log(300.0))))
    grey = rng.poisson(np.clip(grey, 0.0, None) * peak).astype(np.float32) / peak
    grey += rng.normal(0.0, rng.uniform(0.003, 0.03), shape).astype(np.float32)
    if inverted:
        grey = 1.0 - grey
    offset_u8, gain = rng.uniform(0.0, 40.0), rng.uniform(90.0, 210.0)
    image = np.rint(np.clip(offset_u8 + gain * grey, 0, 255)).astype(np.uint8)
    return image, np.stack([boundaries, objects])


def _check(shape: tuple[int, ...], kind: str, anisotropy: int) -> tuple[int, int, int]:
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; use one of {KINDS}.")
    if not 1 <= int(anisotropy) <= 8:
        raise ValueError(f"anisotropy must be a whole number from 1 to 8, got {anisotropy!r}.")
    size = tuple(int(s) for s in shape)
    if len(size) != 3 or size[0] < 4 or min(size[1:]) < 16:
        raise ValueError(f"shape must be (z >= 4, y >= 16, x >= 16); got {shape}.")
    return size


def _nuclei(
    rng: np.random.Generator, fine: tuple[int, int, int], anisotropy: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grey values (before optics), rims and nuclei on the isotropic grid ``fine``."""
    grey = np.full(fine, rng.uniform(0.0, 0.12), np.float32)
    # A dim, uneven background (out-of-focus light, autofluorescence).
    grey += rng.uniform(0.0, 0.05) * (1 + _smooth_noise(rng, fine, 16.0))
    objects = np.zeros(fine, bool)
    rims = np.zeros(fine, bool)
    # Sizes vary between volumes (magnification) and within one (cell cycle).
    typical = rng.uniform(6.0, 42.0)
    fill = rng.uniform(0.05, 0.35)
    volume = float(np.prod(fine))
    wobble = _smooth_noise(rng, fine, max(2.0, typical / 3))
    texture = _smooth_noise(rng, fine, rng.uniform(1.5, 4.0))
    placed: list[tuple[np.ndarray, np.ndarray]] = []
    drawn = 0.0
    for _ in range(400):
        if drawn >= fill * volume:
            break
        semi_xy = typical * rng.uniform(0.6, 1.3) * np.array([1.0, rng.uniform(0.7, 1.0)])
        # Flattened on the coverslip: thinner along z than across.
        semi = np.array([semi_xy.mean() * rng.uniform(0.35, 0.9), *semi_xy])
        # The centre may lie outside in z a little (a cap cut by the stack) and in y-x.
        center = rng.uniform(-0.3 * semi, np.array(fine) + 0.3 * semi)
        if any(
            np.linalg.norm((center - c) / (semi + s)) < 0.85 for c, s in placed
        ):
            continue  # touching is fine, nuclei do not overlap
        placed.append((center, semi))
        angle = rng.uniform(0, np.pi)
        r = int(np.ceil(semi.max() * 1.2)) + 2
        lo = np.maximum(np.floor(center).astype(int) - r, 0)
        hi = np.minimum(np.floor(center).astype(int) + r + 1, fine)
        if np.any(hi <= lo):
            continue
        box = tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))
        zz, yy, xx = np.ogrid[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))]
        dz, dy, dx = zz - center[0], yy - center[1], xx - center[2]
        u = np.cos(angle) * dy + np.sin(angle) * dx
        v = -np.sin(angle) * dy + np.cos(angle) * dx
        level = np.sqrt((dz / semi[0]) ** 2 + (u / semi[1]) ** 2 + (v / semi[2]) ** 2)
        level = level * (1 + 0.08 * wobble[box])
        body = level < 1.0
        if not body.any():
            continue
        # The rim: within RIM voxels (y-x units) of the surface, i.e. a level band.
        rim = body & (level > 1.0 - RIM / semi[1:].min())
        brightness = rng.uniform(0.35, 1.0)
        inside = brightness * (1 + rng.uniform(0.1, 0.4) * texture[box])
        # Nucleoli: a few darker blobs; chromatin brighter near the envelope at times.
        inside = inside * (1 - rng.uniform(0.0, 0.3) * np.clip(level, 0, 1) ** 4)
        for _ in range(int(rng.integers(0, 4))):
            spot = rng.uniform(-0.5, 0.5, 3) * semi
            rad = rng.uniform(0.12, 0.25) * semi[1:].min()
            spot_mask = ((dz - spot[0]) ** 2 + ((dy - spot[1]) ** 2 + (dx - spot[2]) ** 2)) < rad**2
            inside = np.where(spot_mask, inside * rng.uniform(0.3, 0.7), inside)
        grey[box] = np.where(body, inside, grey[box])
        objects[box] |= body
        rims[box] |= rim
        drawn += float(body.sum())
    del anisotropy  # the geometry is isotropic; the caller keeps one slice in anisotropy
    return grey, rims, objects


def _cells(
    rng: np.random.Generator, fine: tuple[int, int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cells of a warped Voronoi tessellation whose membranes are bright and punctate."""
    from scipy.spatial import cKDTree

    diameter = rng.uniform(18.0, 60.0)
    n_cells = max(4, int(round(np.prod(fine) / (0.5 * diameter**3))))
    seeds = rng.uniform(-8.0, np.array(fine, float) + 8.0, size=(n_cells, 3))
    grid = np.indices(fine, dtype=np.float32).reshape(3, -1).T
    warp = np.stack([_smooth_noise(rng, fine, 12.0).ravel() for _ in range(3)], axis=1)
    dist, idx = cKDTree(seeds).query(grid + 3.0 * warp, k=2, workers=2)
    gap = np.linalg.norm(seeds[idx[:, 0]] - seeds[idx[:, 1]], axis=1)
    d_mem = ((dist[:, 1] ** 2 - dist[:, 0] ** 2) / (2 * gap)).reshape(fine).astype(np.float32)
    half = rng.uniform(0.8, 2.0) * (1 + 0.2 * _smooth_noise(rng, fine, 8.0))
    membranes = d_mem < half
    grey = np.full(fine, rng.uniform(0.0, 0.15), np.float32)
    # Some cytoplasm signal, uneven from cell to cell.
    grey += rng.uniform(0.0, 0.15) * rng.uniform(0, 1, n_cells).astype(np.float32)[
        idx[:, 0].reshape(fine)
    ]
    punctate = 1 + rng.uniform(0.2, 0.6) * _smooth_noise(rng, fine, rng.uniform(1.5, 3.0))
    grey[membranes] = (rng.uniform(0.5, 1.0) * punctate)[membranes]
    return grey, membranes, np.zeros(fine, bool)
