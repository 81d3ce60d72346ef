"""A deterministic EM-like volume with ground truth, in two acquisition domains.

Geometry (cells, membranes, mitochondria, vesicles) depends only on ``seed``;
appearance (blur, noise, contrast curve, texture, offset) depends on the
domain. The *source* domain is what the sample checkpoint was trained on; the
*target* domain is another "microscope": blurrier, noisier, with a non-linear
contrast curve. The model normalises every volume by its 1st/99th percentiles,
which removes offset and linear gain, so the gap between domains is made of
what percentiles cannot undo (blur, noise, gamma, texture) -- the kind of
difference a few painted voxels and a short fine-tune do fix, unlike a change
of geometry.

Ground truth: 0 background, 1 membrane, 2 mitochondria (exclusive), i.e. label
``k`` is foreground of output channel ``k - 1`` of :data:`CHANNEL_NAMES`. On
request (``instances=True``) the generator also returns what it drew object by
object: one id per cell region and one per mitochondrion (:data:`INSTANCE_CLASSES`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

import numpy as np

# scipy is imported by the functions that draw (0.3-0.8 s): the constants and paths
# here are read on napari's main thread when the sample opens, which then draws
# nothing (the shipped volume, samples/shipped.py) or draws and needs scipy anyway.
CHANNEL_NAMES = ["membrane", "mitochondria"]
DEFAULT_SHAPE = (64, 256, 256)
DEFAULT_SEEDS = {"source": 0, "target": 1}
# Bump whenever the output for a given (shape, seed, domain) changes: it is part
# of the cache key, so stale stores are never reused.
GENERATOR_VERSION = 2
DOMAINS = ("source", "target")
# The per-class instance arrays ``generate_volume(..., instances=True)`` returns.
INSTANCE_CLASSES = ("cells", "mitochondria")

CELL_DIAMETER = 52.0  # voxels, typical
MEMBRANE_HALF_WIDTH = 1.5  # voxels: membranes are ~3 voxels thick


@dataclass(frozen=True)
class Appearance:
    """How a domain turns the geometry into grey values (intensities in [0, 1])."""

    blur: tuple[float, float, float]  # gaussian sigma per axis (z, y, x), voxels
    noise: float  # std of additive noise after blur
    shot: float  # std of signal-dependent noise, times sqrt(intensity)
    gamma: float  # contrast curve applied after blur: i -> i ** gamma
    texture: float  # amplitude of cytoplasm texture
    texture_scale: float  # its correlation length, voxels
    offset: float  # uint8 value of intensity 0
    gain: float  # uint8 units per intensity unit


APPEARANCES = {
    "source": Appearance(
        blur=(0.6, 0.6, 0.6), noise=0.03, shot=0.02, gamma=1.0, texture=0.05,
        texture_scale=2.5, offset=12.0, gain=230.0,
    ),
    # Another instrument: more blur (worse in z, as in many EM set-ups), more
    # noise, a contrast curve that lifts the darks, finer grain. Measured with the
    # sample model: blur is what hurts (blurred membranes read as mitochondria);
    # noise and gamma alone cost little. Stronger blur made the gap too wide for
    # a 2-minute fine-tune (IoU 0.26 membrane before, 0.55 after).
    "target": Appearance(
        blur=(1.2, 1.0, 1.0), noise=0.045, shot=0.025, gamma=0.7, texture=0.08,
        texture_scale=1.2, offset=45.0, gain=160.0,
    ),
}

# Mean grey value of each structure before blur (0 black, 1 white).
CYTOPLASM, MEMBRANE, MITO, MITO_CRISTAE, VESICLE = 0.72, 0.12, 0.30, 0.15, 0.40


def sample_checkpoint_path() -> Path:
    """The pretrained sample UNet shipped with the package (trained on the source domain)."""
    return Path(__file__).with_name("synthetic_em_unet.pt")


def cache_dir() -> Path:
    """Where sample stores are generated (env ``NAPARI_FINETUNE_CACHE`` overrides)."""
    env = os.environ.get("NAPARI_FINETUNE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "napari-finetune"


def _check(shape: tuple[int, ...], domain: str) -> tuple[int, int, int]:
    if domain not in APPEARANCES:
        raise ValueError(f"unknown domain {domain!r}; use one of {DOMAINS}.")
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or min(shape) < 8:
        raise ValueError(f"shape must be 3 sizes (z, y, x), each >= 8; got {shape}.")
    return shape


def _smooth_noise(rng: np.random.Generator, shape, scale: float) -> np.ndarray:
    """Zero-mean, unit-std noise correlated over ``scale`` voxels, made cheaply.

    Drawn on a grid ``scale`` times coarser and upsampled linearly, so a 4 M
    voxel field costs a fraction of a full-resolution gaussian filter.
    """
    from scipy import ndimage

    coarse = tuple(max(2, int(np.ceil(s / scale)) + 2) for s in shape)
    field = ndimage.gaussian_filter(rng.standard_normal(coarse).astype(np.float32), 1.0)
    zoom = [(s + 2 * scale) / c for s, c in zip(shape, coarse, strict=True)]
    # The grid ``ndimage.zoom(field, zoom, order=1)`` would make, of which only the
    # window at ``off`` is kept: that window alone is interpolated.
    full = [int(round(c * z)) for c, z in zip(coarse, zoom, strict=True)]
    off = int(scale)
    up = _upsample_linear(field, full, [slice(off, off + s) for s in shape])
    return ((up - up.mean()) / (up.std() + 1e-6)).astype(np.float32)


def _upsample_linear(field: np.ndarray, full: list[int], window: list[slice]) -> np.ndarray:
    """``ndimage.zoom(field, ..., order=1)`` to shape ``full``, cut to ``window``, separably.

    ``zoom`` visits the 8 corners of every output voxel (1.3 s of the sample's 4.5 s
    on one core); interpolating one axis at a time, the small axes first, touches the
    full-size array once. Same sample points (output ``k`` reads input
    ``k * (n_in - 1) / (n_out - 1)``) in float64, so the values differ from zoom's
    by a rounding at most (float32's last bit), which no threshold downstream sees
    (``test_synthetic_em`` compares the volumes with the former implementation's).
    """
    out = field.astype(np.float64)
    for axis in reversed(range(field.ndim)):
        n_in, n_out = out.shape[axis], full[axis]
        index = np.arange(n_out)[window[axis]]
        pos = index * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(index.size)
        lo = np.minimum(pos.astype(np.intp), n_in - 2)
        shape = [1] * out.ndim
        shape[axis] = index.size
        t = (pos - lo).reshape(shape)
        below = np.take(out, lo, axis=axis)
        above = np.take(out, lo + 1, axis=axis)
        above -= below
        above *= t
        below += above
        out = below
    return out.astype(np.float32)


def _geometry(shape, seed: int, instances: bool = False):
    """Ground truth, cristae stripes, vesicle mask and (on request) the instance arrays.

    The instance arrays are bookkeeping beside the drawing: they consume no random
    numbers, so the image and the semantic truth are the same with or without them.
    """
    from scipy.spatial import cKDTree

    rng = np.random.default_rng([seed, 0xCE11])
    n_cells = max(4, int(round(np.prod(shape) / (0.5 * CELL_DIAMETER**3))))
    # Seeds a little outside the volume too, so cells are cut at the borders.
    lo, hi = -8.0, np.array(shape, float) + 8.0
    seeds = rng.uniform(lo, hi, size=(n_cells, 3))
    grid = np.indices(shape, dtype=np.float32).reshape(3, -1).T
    # A smooth warp of space makes membranes curve instead of being planes.
    warp = np.stack([_smooth_noise(rng, shape, 12.0).ravel() for _ in range(3)], axis=1)
    dist, idx = cKDTree(seeds).query(grid + 3.0 * warp, k=2, workers=2)
    # Distance to the bisector of the two nearest seeds (exact for a Voronoi face).
    gap = np.linalg.norm(seeds[idx[:, 0]] - seeds[idx[:, 1]], axis=1)
    d_mem = ((dist[:, 1] ** 2 - dist[:, 0] ** 2) / (2 * gap)).reshape(shape).astype(np.float32)
    cells = idx[:, 0].reshape(shape).astype(np.int32)
    width = MEMBRANE_HALF_WIDTH * (1 + 0.25 * _smooth_noise(rng, shape, 8.0))
    truth = np.where(d_mem < width, 1, 0).astype(np.uint8)
    cristae = np.zeros(shape, np.float32)
    mito_ids = np.zeros(shape, np.uint32) if instances else None
    _add_mitochondria(rng, shape, cells, d_mem, width, truth, cristae, mito_ids)
    vesicles = _vesicles(rng, shape, truth)
    if not instances:
        return truth, cristae, vesicles, None
    from skimage.segmentation import relabel_sequential

    # Ids 1..N in the order they were drawn (a mitochondrion drawn over entirely is gone).
    mitochondria = relabel_sequential(mito_ids)[0]
    labels = {"cells": _cell_instances(cells, truth), "mitochondria": mitochondria}
    return truth, cristae, vesicles, labels


def _cell_instances(cells: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """One id per cell region: a Voronoi cell's non-membrane voxels, per connected piece.

    A cell cut by the volume's border (or pinched by a warped membrane) can fall
    apart into pieces no segmentation could join, so each piece is its own region;
    conversely a rare gap in a thin membrane must not merge two cells, so the
    Voronoi id separates regions that touch.
    """
    from scipy import ndimage

    interior = truth != 1
    # 6-connectivity: membranes are drawn ~3 voxels thick, a diagonal step through
    # one would be a leak the segmentation cannot see either.
    pieces, _ = ndimage.label(interior)
    key = pieces.astype(np.int64) * (int(cells.max()) + 1) + cells
    key = key[interior]
    # What ``np.unique(key, return_inverse=True)`` numbers (the keys in increasing
    # order, from 0) without sorting 4 M keys: the keys are few and small, so a table
    # over their range ranks them in one pass.
    present = np.zeros(int(key.max()) + 1 if key.size else 1, bool)
    present[key] = True
    rank = np.cumsum(present, dtype=np.int64) - 1
    out = np.zeros(truth.shape, np.uint32)
    out[interior] = rank[key].astype(np.uint32) + 1
    return out


def _add_mitochondria(rng, shape, cells, d_mem, width, truth, cristae, mito_ids=None) -> None:
    """Elongated, wobbly ellipsoids inside cells, clear of membranes; cristae stripes."""
    inside = d_mem > width + 2.0
    n_cells = int(cells.max()) + 1
    candidates = np.flatnonzero(inside[::2, ::2, ::2].ravel())
    if candidates.size == 0:
        return
    coarse_shape = inside[::2, ::2, ::2].shape
    n_mito = int(n_cells * 3)
    picks = rng.choice(candidates, size=min(n_mito, candidates.size), replace=False)
    for number, pos in enumerate(picks, start=1):
        center = np.array(np.unravel_index(pos, coarse_shape)) * 2
        semi = np.array([rng.uniform(7, 15), rng.uniform(3.5, 6.0), rng.uniform(3.5, 6.0)])
        rot = _random_rotation(rng)
        r = int(np.ceil(semi.max())) + 2
        lo = np.maximum(center - r, 0)
        hi = np.minimum(center + r + 1, shape)
        box = tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))
        coords = np.indices(hi - lo, dtype=np.float32).reshape(3, -1).T + (lo - center)
        local = coords @ rot  # axes of the ellipsoid
        # Wobble: a low-order deformation of the radius along the long axis.
        phase, amp = rng.uniform(0, 2 * np.pi), rng.uniform(0.05, 0.2)
        wobble = 1 + amp * np.sin(local[:, 0] / semi[0] * np.pi + phase)
        level = np.sqrt(((local / semi) ** 2).sum(axis=1)) / wobble
        shape_box = tuple(hi - lo)
        body = (level < 1.0).reshape(shape_box)
        body &= inside[box] & (cells[box] == cells[tuple(center)])
        truth[box][body] = 2
        if mito_ids is not None:
            # A later mitochondrion drawn over an earlier one wins, as in the truth.
            mito_ids[box][body] = number
        period = rng.uniform(3.0, 4.5)
        stripes = 0.5 + 0.5 * np.cos(2 * np.pi * local[:, 0] / period).reshape(shape_box)
        cristae[box][body] = stripes[body]


def _random_rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    return q * np.sign(np.diag(r))


def _vesicles(rng, shape, truth) -> np.ndarray:
    """Small dark spheres in the cytoplasm: not labelled, they make mitochondria less trivial."""
    from scipy import ndimage

    mask = np.zeros(shape, bool)
    n = int(np.prod(shape) / 6000)
    centers = (rng.uniform(0, 1, size=(n, 3)) * np.array(shape)).astype(int)
    mask[tuple(centers.T)] = True
    mask = ndimage.binary_dilation(mask, ndimage.generate_binary_structure(3, 1), iterations=2)
    return mask & (truth == 0)


@overload
def generate_volume(
    shape: tuple[int, int, int] = ...,
    seed: int | None = ...,
    domain: str = ...,
    appearance: Appearance | None = ...,
    instances: Literal[False] = ...,
) -> tuple[np.ndarray, np.ndarray]: ...


@overload
def generate_volume(
    shape: tuple[int, int, int] = ...,
    seed: int | None = ...,
    domain: str = ...,
    appearance: Appearance | None = ...,
    *,
    instances: Literal[True],
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]: ...


def generate_volume(
    shape: tuple[int, int, int] = DEFAULT_SHAPE,
    seed: int | None = None,
    domain: str = "target",
    appearance: Appearance | None = None,
    instances: bool = False,
) -> tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Generate one volume and its ground truth (and, on request, its instances).

    Parameters
    ----------
    shape : (z, y, x)
        Each size >= 8.
    seed : int, optional
        Geometry seed; same seed -> same cells in both domains. Defaults to
        ``DEFAULT_SEEDS[domain]``.
    domain : {"source", "target"}
        Appearance of the acquisition (and a stream of its noise).
    appearance : Appearance, optional
        Another microscope than the domain's (benchmarks on unseen appearances).
    instances : bool
        Also return the instance truth. The image and ground truth are the same
        either way.

    Returns
    -------
    image : np.ndarray of uint8
    ground_truth : np.ndarray of uint8
        0 background, 1 membrane, 2 mitochondria.
    instance_truth : dict of str to np.ndarray of uint32, only with ``instances``
        ``"cells"``: ids 1..N, one per connected region of one cell, 0 on
        membrane (a cell's mitochondria belong to it). ``"mitochondria"``: ids
        1..M, one per drawn mitochondrion (two may touch; an id may be cut in
        pieces by its cell's membrane), 0 elsewhere.
    """
    from scipy import ndimage

    shape = _check(shape, domain)
    seed = DEFAULT_SEEDS[domain] if seed is None else int(seed)
    look = APPEARANCES[domain] if appearance is None else appearance
    truth, cristae, vesicles, labels = _geometry(shape, seed, instances)
    rng = np.random.default_rng([seed, DOMAINS.index(domain), 0xA11])
    grey = np.full(shape, CYTOPLASM, np.float32)
    grey += look.texture * _smooth_noise(rng, shape, look.texture_scale)
    grey[vesicles] = VESICLE
    grey[truth == 1] = MEMBRANE
    mito = truth == 2
    grey[mito] = MITO + (MITO_CRISTAE - MITO) * cristae[mito]
    grey = ndimage.gaussian_filter(grey, look.blur)
    np.clip(grey, 0.0, 1.0, out=grey)
    grey **= look.gamma
    noise = rng.standard_normal(shape, dtype=np.float32)
    grey += noise * (look.noise + look.shot * np.sqrt(grey))
    image = np.clip(look.offset + look.gain * grey, 0, 255)
    image = np.rint(image).astype(np.uint8)
    if instances:
        return image, truth, labels
    return image, truth
