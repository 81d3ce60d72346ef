"""Training patches anchored on the painted voxels.

The user paints a few strokes on a big volume; sampling patches uniformly
would show the model almost nothing painted. Every patch is anchored on a
painted voxel, the painted classes take turns (a few background strokes must
not drown one mitochondrion), and the anchor lands anywhere inside the patch
(jitter) so the model does not learn "the centre is special". Only the
patches are read, so zarr and dask volumes are never loaded whole; the
corrections are scanned once in slabs to find the painted voxels. The part of
a store the patches can reach is read once into memory when it fits a budget
(``data.region_cache``), so the training step does not wait for the store.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from napari_finetune.arrays import AxesImage, VolumeArray
from napari_finetune.data.holdout import HeldOut, holdout_tile_shape, split_holdout
from napari_finetune.data.normalization import missing_mask, normalize, normalize_channels
from napari_finetune.data.region_cache import RegionCache, reachable_tiles

# Bounds memory when someone paints with a huge brush: anchors are a sample.
MAX_ANCHORS_PER_CLASS = 1_000_000
SLAB_VOXELS = 16_000_000


class PatchSampler:
    """Draws augmented (image, corrections) patch pairs around painted voxels.

    Parameters
    ----------
    image : array-like or AxesImage
        Raw volume (numpy, zarr or dask), ZYX or YX; or an
        :class:`~napari_finetune.arrays.AxesImage` with channels (every patch holds
        them all, the model's input channels) and/or time points (a patch is cut
        from one time point, anchored on a voxel painted at that time).
    corrections : array-like
        Labels of the image's shape without its channel axis
        (:attr:`~napari_finetune.arrays.AxesImage.labels_shape`): 0 unpainted,
        1 background, k >= 2 channel k-2.
    patch_shape : tuple of int
        Spatial patch size, one entry per spatial axis.
    normalization_range : (float, float), or a list of them
        Intensities mapped to 0 and 1 (see ``data.normalization``), one pair per
        channel of an image with channels.
    seed : int
        Seeds the generator; the same seed gives the same patches.
    augment : bool
        Random flips on every axis and rot90 in the YX plane.
    max_label : int, optional
        Largest label the model understands (``out_channels + 1``); a larger
        painted label is an error instead of a silent crash later.
    cache_bytes : int
        Keep the image and corrections around the painted voxels in memory when
        they fit this many bytes (read on the first draw); 0 reads every patch
        from the arrays. Arrays already in memory (numpy) are never copied.
    holdout_fraction : float
        Share of each class's painted voxels kept out of training, as whole
        regions (``data.holdout``), to score the run on; 0 trains on all.

    Raises
    ------
    ValueError
        Shapes that do not match, or nothing painted.
    """

    def __init__(
        self,
        image: VolumeArray | AxesImage,
        corrections: VolumeArray,
        patch_shape: tuple[int, ...],
        normalization_range: tuple[float, float] | list[tuple[float, float]],
        seed: int = 0,
        augment: bool = True,
        max_label: int | None = None,
        cache_bytes: int = 0,
        holdout_fraction: float = 0.0,
    ) -> None:
        self.axes_image = AxesImage.of(image)
        # A plain volume keeps the path it always took (region cache, held-out voxels).
        self.plain = self.axes_image.is_plain
        self.image = self.axes_image.array
        self.corrections = corrections
        # The painting's shape: the image's without channels, a time axis first if any.
        self.shape = self.axes_image.labels_shape
        self.patch_shape = tuple(int(s) for s in patch_shape)
        if tuple(corrections.shape) != self.shape:
            raise ValueError(
                f"the corrections have shape {tuple(corrections.shape)} but the image has "
                f"shape {self.shape} (axes {self.axes_image.labels_axes.upper()} without "
                "channels); paint on a labels layer made for this image."
            )
        spatial = self.axes_image.spatial_shape
        if len(self.patch_shape) != len(spatial):
            raise ValueError(
                f"patch_shape {self.patch_shape} has {len(self.patch_shape)} axes but the "
                f"image has {len(spatial)} ({spatial}); give one size per axis."
            )
        # A patch spans one time point: its box over the painting has extent 1 there.
        self._box_patch = (1,) * self.axes_image.has_time + self.patch_shape
        pairs = (
            normalization_range if isinstance(normalization_range, list)
            else [normalization_range]
        )
        self.ranges = [(float(lo), float(hi)) for lo, hi in pairs]
        if len(self.ranges) != self.axes_image.channels:
            raise ValueError(
                f"{len(self.ranges)} normalisation ranges for an image of "
                f"{self.axes_image.channels} channels; give one (low, high) per channel."
            )
        self.low, self.high = self.ranges[0]
        self.augment = augment
        self.rng = np.random.default_rng(seed)
        self.anchors, self.class_counts = _find_anchors(corrections, self.rng)
        if not self.anchors:
            raise ValueError(
                "nothing is painted in the corrections: paint background (label 1) and the "
                "structures the model gets wrong (labels 2 and up) before fine-tuning."
            )
        if max_label is not None and max(self.anchors) > max_label:
            raise ValueError(
                f"label {max(self.anchors)} is painted but the model only has labels 1.."
                f"{max_label} (1 = background, 2.. = its {max_label - 1} channels); "
                "repaint those voxels with a valid label."
            )
        # Channels and time points read each patch from the arrays and keep no voxels
        # out: the region cache and the held-out check read spatial boxes of one channel.
        self.caches = self._region_caches(int(cache_bytes)) if self.plain else None
        self.holdout: HeldOut = split_holdout(
            self.anchors, self.shape, holdout_tile_shape(self._box_patch),
            holdout_fraction if self.plain else 0.0, seed=seed,
        )
        if self.holdout:
            # Held-out voxels anchor no patch; _read_patch also unpaints them in patches
            # anchored nearby, so the model is never told their answer.
            self.anchors = {
                v: a[~self.holdout.contains(a)] for v, a in self.anchors.items()
            }

    def _region_caches(self, budget: int) -> tuple[RegionCache, RegionCache] | None:
        """Tiles of image and corrections the patches can reach, if they fit ``budget``."""
        in_memory = all(
            isinstance(a, np.ndarray) and not isinstance(a, np.memmap)
            for a in (self.image, self.corrections)
        )
        if budget <= 0 or in_memory:
            return None
        tiles = reachable_tiles(self.anchors.values(), self.patch_shape, self.shape)
        caches = (
            RegionCache(self.image, tiles, self.patch_shape),
            RegionCache(self.corrections, tiles, self.patch_shape),
        )
        return caches if sum(c.nbytes for c in caches) <= budget else None

    def read_image(self, box: tuple[slice, ...]) -> np.ndarray:
        """``image[box]``, from memory when the cached tiles are loaded and hold it.

        For previews and predictions during a run: a region the run already
        holds is not read from the store again; any other region is, and the
        cache is never filled from here (that happens in the sampling thread).
        An image with channels or time points gives ``(C, *spatial)`` of ``box``
        over its painting (a time point first).
        """
        box = tuple(
            slice(*b.indices(s)[:2]) for b, s in zip(box, self.shape, strict=True)
        )
        if not self.plain:  # (C, *spatial) of one time point
            return self.axes_image.read(box)
        if self.caches is not None and self.caches[0].covers(box):
            return self.caches[0].read(box)
        return np.asarray(self.image[box])

    def read_corrections(self, box: tuple[slice, ...]) -> np.ndarray:
        """``corrections[box]``, from memory when the cached tiles are loaded and hold it.

        The held-out check reads the painting of its tiles here, so a run that
        holds its region in memory does not go back to the store to score.
        """
        box = tuple(
            slice(*b.indices(s)[:2]) for b, s in zip(box, self.shape, strict=True)
        )
        if self.caches is not None and self.caches[1].covers(box):
            return self.caches[1].read(box)
        return np.asarray(self.corrections[box])

    @property
    def cached_bytes(self) -> int:
        """Bytes kept in memory around the painted voxels (0: patches read from the arrays)."""
        return 0 if self.caches is None else sum(c.nbytes for c in self.caches)

    @property
    def painted_voxels(self) -> int:
        """Number of painted (non-zero) voxels."""
        return sum(self.class_counts.values())

    @property
    def classes_present(self) -> list[int]:
        """Painted label values, sorted (1 = background, k >= 2 = channel k-2)."""
        return sorted(self.anchors)

    def get_state(self) -> dict[str, Any]:
        """The generator state, to restore with :meth:`set_state`."""
        return dict(self.rng.bit_generator.state)

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`get_state` (the precision probe uses this)."""
        self.rng.bit_generator.state = state

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` patches.

        Returns
        -------
        images : np.ndarray
            float32, shape ``(n, C, *patch_shape)``, normalised (C = 1 without channels).
        labels : np.ndarray
            int64, shape ``(n, *patch_shape)``, the raw correction values.
        """
        classes = self.classes_present
        images = np.empty((n, len(self.ranges), *self.patch_shape), dtype=np.float32)
        labels = np.empty((n, *self.patch_shape), dtype=np.int64)
        # Classes take turns from a random start so every class appears in
        # every batch of at least len(classes) patches.
        first = int(self.rng.integers(len(classes)))
        for i in range(n):
            pool = self.anchors[classes[(first + i) % len(classes)]]
            anchor = pool[int(self.rng.integers(len(pool)))]
            image, label = self._read_patch(anchor)
            if self.augment:
                image, label = self._augment(image, label)
            images[i] = image
            labels[i] = label
        return images, labels

    def _read_patch(self, anchor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        starts = []
        for a, p, s in zip(anchor, self._box_patch, self.shape, strict=True):
            start = int(a) - int(self.rng.integers(p))  # jitter: anchor anywhere in the patch
            starts.append(min(max(start, 0), max(s - p, 0)))
        box = tuple(
            slice(st, min(st + p, s))
            for st, p, s in zip(starts, self._box_patch, self.shape, strict=True)
        )
        if not self.plain:
            raw = self.axes_image.read(box)  # (C, *spatial) of the anchor's time point
            label = np.asarray(self.corrections[box]).astype(np.int64)
            label = label.reshape(label.shape[-len(self.patch_shape):])
            image = normalize_channels(raw, self.ranges)
            per_channel = missing_mask(raw)
            # One channel without a value is enough.
            missing = None if per_channel is None else np.asarray(per_channel.any(axis=0))
        else:
            if self.caches is None:
                raw = np.asarray(self.image[box])
                label = np.asarray(self.corrections[box]).astype(np.int64)
            else:
                raw = self.caches[0].read(box)
                label = self.caches[1].read(box).astype(np.int64)
            self.holdout.mask_box(label, box)
            image = normalize(raw, self.low, self.high)[None]
            missing = missing_mask(raw)
        if missing is not None:
            label[missing] = 0  # a painted voxel without an image value teaches nothing
        pad = [(0, p - got) for p, got in zip(self.patch_shape, label.shape, strict=True)]
        if any(after for _, after in pad):
            # Volume smaller than the patch: mirror the image, leave labels unpainted.
            image = np.pad(image, [(0, 0), *pad],
                           mode="reflect" if min(label.shape) > 1 else "edge")
            label = np.pad(label, pad, mode="constant")
        return image, label

    def _augment(self, image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # ``image`` is (C, *spatial): its spatial axis i is axis i + 1.
        for axis in range(label.ndim):
            if self.rng.random() < 0.5:
                image, label = np.flip(image, axis + 1), np.flip(label, axis)
        y, x = image.shape[-2:]
        # A quarter turn only keeps the patch shape when the YX plane is square.
        k = int(self.rng.integers(4)) if y == x else 2 * int(self.rng.integers(2))
        if k:
            image = np.rot90(image, k, axes=(-2, -1))
            label = np.rot90(label, k, axes=(-2, -1))
        return np.ascontiguousarray(image), np.ascontiguousarray(label)


def _slabs(shape: tuple[int, ...]) -> list[slice]:
    per_plane = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    step = max(1, SLAB_VOXELS // max(per_plane, 1))
    return [slice(z, min(z + step, shape[0])) for z in range(0, shape[0], step)]


def _find_anchors(
    corrections: VolumeArray, rng: np.random.Generator
) -> tuple[dict[int, np.ndarray], dict[int, int]]:
    """Coordinates (a sample when huge) and counts of painted voxels per label, read by slabs."""
    found: dict[int, list[np.ndarray]] = {}
    for slab in _slabs(tuple(corrections.shape)):
        block = np.asarray(corrections[slab])
        coords = np.argwhere(block > 0)
        if not len(coords):
            continue
        values = block[tuple(coords.T)]
        coords[:, 0] += slab.start
        for value in np.unique(values):
            found.setdefault(int(value), []).append(coords[values == value].astype(np.int32))
    anchors, counts = {}, {}
    for value, parts in found.items():
        coords = np.concatenate(parts)
        counts[value] = len(coords)
        if len(coords) > MAX_ANCHORS_PER_CLASS:
            coords = coords[rng.choice(len(coords), MAX_ANCHORS_PER_CLASS, replace=False)]
        anchors[value] = coords
    return anchors, counts
