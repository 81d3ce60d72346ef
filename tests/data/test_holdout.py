"""Held-out painted regions: whole tiles, a share per class, never trained on."""

from __future__ import annotations

import numpy as np

from napari_finetune.data.holdout import split_holdout
from napari_finetune.data.sampling import PatchSampler

SHAPE = (16, 64, 64)
PATCH = (4, 16, 16)


def striped_painting() -> np.ndarray:
    """Background strokes over many tiles, one channel's strokes over several."""
    corrections = np.zeros(SHAPE, np.uint8)
    corrections[2, 4:60, 4:60:8] = 1
    corrections[9, 10:50, 30] = 2
    corrections[13, 40, 5:60] = 2
    return corrections


def test_split_holds_out_whole_tiles_about_the_share_and_keeps_training_tiles():
    corrections = striped_painting()
    anchors = {v: np.argwhere(corrections == v) for v in (1, 2)}
    held = split_holdout(anchors, SHAPE, (2, 8, 8), fraction=0.1, seed=0)
    assert held.tiles
    for value, coords in anchors.items():
        inside = held.contains(coords)
        assert 0.1 * len(coords) <= inside.sum() < len(coords)  # a share, never all
        assert held.voxels[value] == inside.sum()
    # whole tiles: a held-out tile's painted voxels are all held out
    for tile in held.tiles:
        box = held.tile_box(tile)
        painted = np.argwhere(corrections[box] > 0) + [b.start for b in box]
        assert held.contains(painted).all()
    again = split_holdout(anchors, SHAPE, (2, 8, 8), fraction=0.1, seed=0)
    assert again.tiles == held.tiles
    assert split_holdout(anchors, SHAPE, (2, 8, 8), fraction=0.0).tiles == frozenset()


def test_a_class_painted_in_one_tile_is_not_held_out():
    corrections = np.zeros(SHAPE, np.uint8)
    corrections[2, 4:60, 4:60:8] = 1
    corrections[9, 10:12, 30] = 2  # two voxels in one tile
    anchors = {v: np.argwhere(corrections == v) for v in (1, 2)}
    held = split_holdout(anchors, SHAPE, (2, 8, 8), fraction=0.5, seed=0)
    assert 2 not in held.voxels and held.voxels[1] > 0


def test_held_out_voxels_never_reach_a_training_patch():
    # Each voxel's intensity is its own index, so a patch tells where its voxels came from
    # even after flips and rotations.
    image = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    corrections = striped_painting()
    sampler = PatchSampler(image, corrections, PATCH, (0.0, 1.0), seed=1, holdout_fraction=0.2)
    held = sampler.holdout
    assert held.voxels
    trained_on_held = 0
    painted_seen = 0
    for _ in range(40):
        images, labels = sampler.sample(4)
        where = np.unravel_index(images[:, 0].astype(np.int64).ravel(), SHAPE)
        coords = np.stack(where, axis=1)
        painted = labels.ravel() > 0
        painted_seen += painted.sum()
        trained_on_held += (held.contains(coords) & painted).sum()
    assert painted_seen > 0 and trained_on_held == 0
    # ... while the same painting without a hold-out does put those voxels into patches
    plain = PatchSampler(image, corrections, PATCH, (0.0, 1.0), seed=1)
    images, labels = plain.sample(40)
    coords = np.stack(np.unravel_index(images[:, 0].astype(np.int64).ravel(), SHAPE), axis=1)
    assert (held.contains(coords) & (labels.ravel() > 0)).any()
