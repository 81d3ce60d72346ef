"""The part of a store the patches can reach, kept in memory: same samples, bounded reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_finetune.config import FinetuneConfig
from napari_finetune.data.region_cache import reachable_tiles
from napari_finetune.data.sampling import PatchSampler
from napari_finetune.model.unet import UNet
from napari_finetune.trainer.loop import Finetuner

PATCH = (8, 16, 16)
SHAPE = (48, 128, 128)


class BoxRecorder:
    """Array-like (not numpy, like a zarr or dask array) that records every box read."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype
        self.boxes: list[tuple[slice, ...]] = []

    def __getitem__(self, key):
        self.boxes.append(key)
        return self.array[key]

    @property
    def voxels_read(self) -> int:
        return sum(int(np.prod([s.stop - s.start for s in box])) for box in self.boxes)


def two_far_strokes() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, SHAPE).astype(np.uint8)
    corrections = np.zeros(SHAPE, np.uint8)
    corrections[3, 10:20, 10:20] = 1  # a stroke near one corner ...
    corrections[44, 100:104, 110:118] = 2  # ... and one near the opposite corner
    return image, corrections


def draws(sampler: PatchSampler, times: int = 12) -> list[tuple[np.ndarray, np.ndarray]]:
    return [sampler.sample(3) for _ in range(times)]


def test_reads_stay_near_the_strokes_and_happen_once():
    image, corrections = two_far_strokes()
    recorded = BoxRecorder(image)
    sampler = PatchSampler(recorded, BoxRecorder(corrections), PATCH, (0, 255), seed=0,
                           cache_bytes=2**30)
    assert recorded.boxes == []  # nothing is read before the first draw
    sampler.sample(2)
    after_first = len(recorded.boxes)
    draws(sampler)
    assert len(recorded.boxes) == after_first  # every later patch came from memory
    painted = np.argwhere(corrections > 0)
    reach = 2 * np.asarray(PATCH)
    for box in recorded.boxes:
        lo = np.array([s.start for s in box])
        hi = np.array([s.stop for s in box])
        near = np.all((painted - reach <= lo) & (hi <= painted + reach), axis=1)
        assert near.any(), f"read {box} is more than two patches from every painted voxel"
    # two strokes reach at most 2 x 3x3x3 tiles of the patch shape: a small share of the volume
    assert recorded.voxels_read <= 2 * 27 * int(np.prod(PATCH))
    assert recorded.voxels_read < 0.1 * image.size
    assert sampler.cached_bytes > 0
    assert all(cache.misses == 0 for cache in sampler.caches)


def test_cached_samples_equal_store_samples():
    image, corrections = two_far_strokes()

    def sampler(cache_bytes: int) -> PatchSampler:
        return PatchSampler(BoxRecorder(image), BoxRecorder(corrections), PATCH, (0, 255),
                            seed=3, cache_bytes=cache_bytes)

    for (a_img, a_lab), (b_img, b_lab) in zip(draws(sampler(0)), draws(sampler(2**30)),
                                              strict=True):
        np.testing.assert_array_equal(a_img, b_img)
        np.testing.assert_array_equal(a_lab, b_lab)


def test_over_budget_or_in_memory_nothing_is_cached():
    image, corrections = two_far_strokes()
    small = PatchSampler(BoxRecorder(image), BoxRecorder(corrections), PATCH, (0, 255),
                         cache_bytes=1000)
    assert small.caches is None and small.cached_bytes == 0
    numpy = PatchSampler(image, corrections, PATCH, (0, 255), cache_bytes=2**30)
    assert numpy.caches is None  # already in memory: never copied


def test_reachable_tiles_cover_every_patch_at_the_volume_edges():
    shape, patch = (10, 37, 37), (4, 8, 8)
    corner = np.array([[0, 0, 0], [9, 36, 36], [5, 20, 3]])
    tiles = {tuple(t) for t in reachable_tiles([corner], patch, shape)}
    # the tile of every voxel any patch anchored there can cover, jitter and clamping included
    for anchor in corner:
        for jitter in np.ndindex(*patch):
            start = [min(max(a - j, 0), max(s - p, 0))
                     for a, j, p, s in zip(anchor, jitter, patch, shape, strict=True)]
            for end in ([min(st + p, s) - 1 for st, p, s in zip(start, patch, shape, strict=True)],
                        start):
                assert tuple(e // p for e, p in zip(end, patch, strict=True)) in tiles


def test_finetuner_weights_are_the_same_with_and_without_the_cache():
    image, corrections = two_far_strokes()

    def train(cache_gib: float) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = UNet(dims=3, in_channels=1, out_channels=2, depth=2, features=4)
        config = FinetuneConfig(steps=2, batch_size=2, patch_shape=PATCH, device="cpu",
                                mixed_precision=False, sample_cache_gib=cache_gib, seed=0)
        trainer = Finetuner(model, BoxRecorder(image), BoxRecorder(corrections), config)
        list(trainer.run())
        assert (trainer.sampler.cached_bytes > 0) == (cache_gib > 0)
        return {k: v.clone() for k, v in trainer.model.state_dict().items()}

    cached, uncached = train(1.0), train(0.0)
    for name, value in cached.items():
        torch.testing.assert_close(value, uncached[name], rtol=0, atol=0)


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_cache_budget_is_validated(bad):
    with pytest.raises(ValueError, match="sample_cache_gib"):
        FinetuneConfig(sample_cache_gib=bad)


def test_previews_of_the_painted_region_come_from_memory():
    image, corrections = two_far_strokes()
    recorded = BoxRecorder(image)
    config = FinetuneConfig(steps=1, batch_size=2, patch_shape=PATCH, device="cpu",
                            mixed_precision=False, seed=0)
    torch.manual_seed(0)
    model = UNet(dims=3, in_channels=1, out_channels=2, depth=2, features=4)
    trainer = Finetuner(model, recorded, BoxRecorder(corrections), config)
    list(trainer.run())
    near = (slice(0, 8), slice(0, 32), slice(0, 32))  # inside the first stroke's tiles
    far = (slice(16, 24), slice(48, 80), slice(48, 80))  # nowhere near a stroke
    reads = len(recorded.boxes)
    by_cache = trainer.predict(near)
    assert len(recorded.boxes) == reads
    np.testing.assert_array_equal(by_cache, trainer.predict(image[near]))
    trainer.predict(far)
    assert len(recorded.boxes) == reads + 1  # read from the store, not cached


def test_corrections_are_read_from_memory_once_cached():
    image, corrections = two_far_strokes()
    labels = BoxRecorder(corrections)
    sampler = PatchSampler(BoxRecorder(image), labels, PATCH, (0, 255), seed=0,
                           cache_bytes=2**30)
    sampler.sample(2)  # loads the tiles
    read = len(labels.boxes)
    box = (slice(0, 8), slice(8, 24), slice(4, 20))  # next to a stroke: cached
    np.testing.assert_array_equal(sampler.read_corrections(box), corrections[box])
    assert len(labels.boxes) == read  # came from memory
    far = (slice(20, 28), slice(50, 60), slice(0, 16))  # reached by no patch
    np.testing.assert_array_equal(sampler.read_corrections(far), corrections[far])
    assert len(labels.boxes) == read + 1  # read from the store, the cache untouched
    assert sampler.caches[1].misses == 0
