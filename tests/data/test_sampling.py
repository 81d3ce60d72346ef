import dask.array as da
import numpy as np
import pytest
import zarr

from napari_finetune.data.sampling import PatchSampler


class ReadRecorder:
    """Array-like that records every read, to prove the volume is never loaded whole."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype
        self.reads: list[int] = []

    def __getitem__(self, key):
        out = self.array[key]
        self.reads.append(out.size)
        return out


def _volume(shape=(16, 48, 48)):
    rng = np.random.default_rng(1)
    image = rng.integers(0, 255, shape).astype(np.uint8)
    corrections = np.zeros(shape, np.uint8)
    corrections[2:10, 5:30, 5:30] = 1  # lots of background
    corrections[8, 40, 40] = 2  # a single voxel of channel 0
    return image, corrections


def test_every_patch_holds_its_anchor_class_and_classes_take_turns():
    image, corrections = _volume()
    sampler = PatchSampler(image, corrections, (8, 16, 16), (0, 255), seed=0)
    _, labels = sampler.sample(20)
    with_rare = sum(int((patch == 2).any()) for patch in labels)
    # Round-robin over the two classes: exactly half the patches are anchored on the rare voxel.
    assert with_rare >= 10
    assert all((patch > 0).any() for patch in labels)
    assert sampler.classes_present == [1, 2]
    assert sampler.painted_voxels == 8 * 25 * 25 + 1
    assert sampler.class_counts == {1: 8 * 25 * 25, 2: 1}


def test_images_are_normalised_and_shapes_are_right():
    image, corrections = _volume()
    sampler = PatchSampler(image, corrections, (8, 16, 16), (0, 255), seed=0)
    images, labels = sampler.sample(3)
    assert images.shape == (3, 1, 8, 16, 16) and images.dtype == np.float32
    assert labels.shape == (3, 8, 16, 16) and labels.dtype == np.int64
    assert images.min() >= 0 and images.max() <= 1


def test_augmentation_keeps_image_and_labels_aligned():
    shape = (12, 32, 32)
    rng = np.random.default_rng(3)
    corrections = rng.integers(0, 4, shape).astype(np.uint8)
    image = corrections.astype(np.float32) * 10  # image encodes the label exactly
    sampler = PatchSampler(image, corrections, (6, 16, 16), (0, 10), seed=5)
    images, labels = sampler.sample(16)
    np.testing.assert_array_equal(np.rint(images[:, 0]).astype(np.int64), labels)


def test_same_seed_same_patches_and_state_round_trip():
    image, corrections = _volume()
    a = PatchSampler(image, corrections, (8, 16, 16), (0, 255), seed=7)
    b = PatchSampler(image, corrections, (8, 16, 16), (0, 255), seed=7)
    np.testing.assert_array_equal(a.sample(4)[0], b.sample(4)[0])
    state = a.get_state()
    first = a.sample(2)[1]
    a.set_state(state)
    np.testing.assert_array_equal(a.sample(2)[1], first)
    c = PatchSampler(image, corrections, (8, 16, 16), (0, 255), seed=8)
    assert not np.array_equal(c.sample(4)[0], b.sample(4)[0])


def test_only_patches_are_read_from_the_image():
    image, corrections = _volume()
    recorded = ReadRecorder(image)
    sampler = PatchSampler(recorded, corrections, (8, 16, 16), (0, 255), seed=0)
    sampler.sample(5)
    assert len(recorded.reads) == 5
    assert max(recorded.reads) <= 8 * 16 * 16


@pytest.mark.parametrize("kind", ["zarr", "dask"])
def test_lazy_arrays(tmp_path, kind):
    image, corrections = _volume()
    if kind == "zarr":
        image_arr = zarr.create_array(tmp_path / "i.zarr", shape=image.shape, dtype=image.dtype,
                                      chunks=(8, 16, 16))
        image_arr[:] = image
        corr_arr = zarr.create_array(tmp_path / "c.zarr", shape=image.shape, dtype="uint8",
                                     chunks=(8, 16, 16))
        corr_arr[:] = corrections
    else:
        image_arr = da.from_array(image, chunks=(8, 16, 16))
        corr_arr = da.from_array(corrections, chunks=(8, 16, 16))
    lazy = PatchSampler(image_arr, corr_arr, (8, 16, 16), (0, 255), seed=2)
    eager = PatchSampler(image, corrections, (8, 16, 16), (0, 255), seed=2)
    np.testing.assert_array_equal(lazy.sample(3)[0], eager.sample(3)[0])


def test_2d_and_volume_smaller_than_patch():
    image = np.arange(20 * 12, dtype=np.float32).reshape(20, 12)
    corrections = np.zeros_like(image, dtype=np.uint8)
    corrections[5, 5] = 3
    sampler = PatchSampler(image, corrections, (16, 16), (0, 240), seed=0)
    images, labels = sampler.sample(2)
    assert images.shape == (2, 1, 16, 16)
    assert (labels == 3).sum() == 2  # padding adds no painted voxel


def test_clear_errors():
    image, corrections = _volume()
    with pytest.raises(ValueError, match="nothing is painted"):
        PatchSampler(image, np.zeros_like(corrections), (8, 16, 16), (0, 255))
    with pytest.raises(ValueError, match="shape"):
        PatchSampler(image, corrections[:-1], (8, 16, 16), (0, 255))
    with pytest.raises(ValueError, match="axes"):
        PatchSampler(image, corrections, (16, 16), (0, 255))
    with pytest.raises(ValueError, match="label 2 is painted but the model only has labels 1..1"):
        PatchSampler(image, corrections, (8, 16, 16), (0, 255), max_label=1)
