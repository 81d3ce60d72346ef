"""The fluorescence generator and the starter family: seeded, sensible truth, the looks
the starter model is trained to cover (bright nuclei, bright membranes, inverted
contrast, voxels coarser in z)."""

import numpy as np
import pytest

from napari_finetune.samples.starter import FAMILIES, starter_checkpoint_path, starter_volume
from napari_finetune.samples.synthetic_fluo import CHANNEL_NAMES, generate_fluo_volume

SHAPE = (8, 64, 64)


def test_same_seed_same_arrays_and_other_seed_differs():
    a = generate_fluo_volume(SHAPE, 3, "nuclei", 2)
    b = generate_fluo_volume(SHAPE, 3, "nuclei", 2)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    c = generate_fluo_volume(SHAPE, 4, "nuclei", 2)
    assert not np.array_equal(a[1], c[1])


def test_nuclei_are_bright_objects_with_rims_on_a_dark_background():
    image, truth = generate_fluo_volume(SHAPE, 1, "nuclei", 1)
    assert image.dtype == np.uint8 and image.shape == SHAPE
    assert truth.dtype == bool and truth.shape == (2, *SHAPE)
    assert CHANNEL_NAMES == ["boundaries", "objects"]
    rims, nuclei = truth
    assert 0.03 < nuclei.mean() < 0.6
    assert rims.any() and not (rims & ~nuclei).any()  # a rim is a nucleus's outer shell
    inside = nuclei & ~rims
    assert image[inside].mean() > image[~nuclei].mean() + 20


def test_inverted_nuclei_are_dark_with_the_same_truth():
    image, truth = generate_fluo_volume(SHAPE, 1, "nuclei", 1, inverted=True)
    _, plain_truth = generate_fluo_volume(SHAPE, 1, "nuclei", 1)
    np.testing.assert_array_equal(truth, plain_truth)
    inside = truth[1] & ~truth[0]
    assert image[inside].mean() < image[~truth[1]].mean() - 20


def test_cells_have_bright_membranes_and_no_objects():
    image, truth = generate_fluo_volume(SHAPE, 2, "cells", 1)
    membranes, objects = truth
    assert not objects.any()
    assert 0.03 < membranes.mean() < 0.5
    assert image[membranes].mean() > image[~membranes].mean() + 20


def test_anisotropy_keeps_one_slice_in_n_of_a_finer_geometry():
    """Coarser z: the truth changes more often from one slice to the next than from one
    column to the next (relative to the isotropic volume), by about the factor."""

    def z_over_x(anisotropy: int) -> float:
        changes_z, changes_x = 0, 0
        for seed in range(3):
            _, truth = generate_fluo_volume((12, 96, 96), seed, "nuclei", anisotropy)
            assert truth.shape == (2, 12, 96, 96)
            changes_z += int((truth[1][1:] != truth[1][:-1]).sum()) / 11
            changes_x += int((truth[1][..., 1:] != truth[1][..., :-1]).sum()) / 95
        return changes_z / changes_x

    # Per slice step: a 4x coarser z crosses about 4x more nucleus surface.
    assert z_over_x(4) > 2.0 * z_over_x(1)


@pytest.mark.parametrize("bad", [
    {"shape": (8, 64), "kind": "nuclei", "anisotropy": 1},
    {"shape": SHAPE, "kind": "mitochondria", "anisotropy": 1},
    {"shape": SHAPE, "kind": "cells", "anisotropy": 0},
])
def test_bad_arguments_are_one_clear_error(bad):
    with pytest.raises(ValueError):
        generate_fluo_volume(bad["shape"], 0, bad["kind"], bad["anisotropy"])


def test_starter_family_draws_every_family_look_and_is_seeded():
    seen = {}
    for seed in range(24):
        image, truth, drawn = starter_volume((8, 32, 32), seed)
        assert image.shape == (8, 32, 32) and truth.shape == (2, 8, 32, 32)
        assert truth.dtype == bool
        seen.setdefault(drawn["family"], set()).add((drawn["anisotropy"], drawn["inverted"]))
    assert set(seen) == set(FAMILIES)
    looks = set().union(*seen.values())
    assert {a for a, _ in looks} >= {1, 5} and {i for _, i in looks} == {True, False}
    again = starter_volume((8, 32, 32), 7)
    first = starter_volume((8, 32, 32), 7)
    np.testing.assert_array_equal(again[0], first[0])
    assert again[2] == first[2]


def test_starter_em_volumes_keep_the_em_truth():
    """An EM member: membranes are the boundaries, mitochondria the objects, exclusive."""
    for seed in range(40):
        image, truth, drawn = starter_volume((8, 48, 48), seed)
        if drawn["family"] == "em":
            break
    else:
        pytest.fail("no EM volume in 40 seeds")
    assert truth[0].any() and not (truth[0] & truth[1]).any()
    membranes = image[truth[0]].mean()
    rest = image[~truth[0] & ~truth[1]].mean()
    assert (membranes > rest) == drawn["inverted"]


def test_starter_checkpoint_path_is_in_the_package():
    assert starter_checkpoint_path().parent.name == "samples"
    assert starter_checkpoint_path().name == "starter_unet.pt"
