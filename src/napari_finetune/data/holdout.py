"""Keep a share of the painted voxels out of training, to score the run on them.

A loss curve says how well the model fits what it trains on, not whether it
gets better at the user's structures. Held-out painted voxels say that. They
are held out as whole regions, not scattered voxels (a voxel next to a trained
one of the same stroke would be scored almost for free): the volume is cut into
tiles of half a patch, and whole tiles holding painted voxels are held out,
rarest class first, until each class has about ``fraction`` of its voxels held
out (and at least ``min_voxels`` when it has that many to spare). A class keeps
at least one tile for training; a class painted in one tile is not held out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from napari_finetune.data.region_cache import overlap, tile_box, tiles_touching

Tile = tuple[int, ...]


@dataclass(frozen=True)
class HeldOut:
    """Tiles of the volume whose painted voxels are not trained on.

    Attributes
    ----------
    tile_shape : tuple of int
        The tile grid's step on every axis.
    shape : tuple of int
        The volume's shape.
    tiles : frozenset of tuple of int
        Grid indices of the held-out tiles.
    voxels : dict
        Held-out painted voxels per label value.
    """

    tile_shape: tuple[int, ...]
    shape: tuple[int, ...]
    tiles: frozenset[Tile] = field(default_factory=frozenset)
    voxels: dict[int, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.tiles)

    def contains(self, coords: np.ndarray) -> np.ndarray:
        """Whether each ``(n, ndim)`` coordinate lies in a held-out tile."""
        if not self.tiles:
            return np.zeros(len(coords), dtype=bool)
        step = np.asarray(self.tile_shape, dtype=np.int64)
        grid = tuple(-(-np.asarray(self.shape, dtype=np.int64) // step))
        flat = np.ravel_multi_index((np.asarray(coords, dtype=np.int64) // step).T, grid)
        held = np.ravel_multi_index(np.array(sorted(self.tiles), dtype=np.int64).T, grid)
        return np.isin(flat, held)

    def tile_box(self, tile: Tile) -> tuple[slice, ...]:
        """One tile as slices of the volume."""
        return tile_box(tile, self.tile_shape, self.shape)

    def mask_box(self, labels: np.ndarray, box: tuple[slice, ...]) -> None:
        """Set to 0 (unpainted) the voxels of ``labels`` (read at ``box``) in held-out tiles."""
        if not self.tiles:
            return
        for tile in tiles_touching(box, self.tile_shape):
            if tile in self.tiles:
                inside, _ = overlap(box, self.tile_box(tile))
                labels[inside] = 0


def holdout_tile_shape(patch_shape: Sequence[int]) -> tuple[int, ...]:
    """Half a patch on every axis (at least 1): regions big enough to be strokes."""
    return tuple(max(1, int(p) // 2) for p in patch_shape)


def split_holdout(
    anchors: dict[int, np.ndarray],
    shape: Sequence[int],
    tile_shape: Sequence[int],
    fraction: float,
    seed: int = 0,
    min_voxels: int = 20,
) -> HeldOut:
    """Choose the held-out tiles.

    Parameters
    ----------
    anchors : dict
        Painted voxel coordinates ``(n, ndim)`` per label value.
    shape : sequence of int
        The volume's shape.
    tile_shape : sequence of int
        Tile grid step.
    fraction : float
        Share of each class's painted voxels to hold out (0 holds out nothing).
    seed : int
        Which tiles are chosen (the same seed, the same split).
    min_voxels : int
        Held out per class at least this many voxels when the class can spare them.
    """
    tile_shape = tuple(int(t) for t in tile_shape)
    shape = tuple(int(s) for s in shape)
    if fraction <= 0:
        return HeldOut(tile_shape, shape)
    rng = np.random.default_rng(seed)
    step = np.asarray(tile_shape, dtype=np.int64)
    per_class: dict[int, dict[Tile, int]] = {}
    for value, coords in anchors.items():
        tiles, counts = np.unique(
            np.asarray(coords, np.int64) // step, axis=0, return_counts=True
        )
        per_class[value] = {
            tuple(int(i) for i in t): int(c) for t, c in zip(tiles, counts, strict=True)
        }
    chosen: set[Tile] = set()
    for value in sorted(per_class, key=lambda v: sum(per_class[v].values())):
        tiles = per_class[value]
        total = sum(tiles.values())
        want = max(fraction * total, min(min_voxels, total / 2))
        held = sum(n for t, n in tiles.items() if t in chosen)
        order = [t for t in tiles if t not in chosen]
        rng.shuffle(order)
        for tile in order:
            if held >= want:
                break
            if sum(n for t, n in tiles.items() if t not in chosen and t != tile) == 0:
                break  # the class keeps at least one tile for training
            if any(_would_empty(per_class[v], chosen, tile) for v in per_class if v != value):
                continue  # nor may another class lose its last training tile
            chosen.add(tile)
            held += tiles[tile]
    voxels = {
        v: sum(n for t, n in tiles.items() if t in chosen) for v, tiles in per_class.items()
    }
    return HeldOut(tile_shape, shape, frozenset(chosen), {v: n for v, n in voxels.items() if n})


def _would_empty(tiles: dict[Tile, int], chosen: set[Tile], tile: Tile) -> bool:
    """Whether holding out ``tile`` too leaves this class no training voxel."""
    return tile in tiles and all(t in chosen or t == tile for t in tiles)
