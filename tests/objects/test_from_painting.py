"""Seed distance and min size from the painted objects (objects/from_painting.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from tests.objects.painted_nuclei import SHAPE, TODAY, nuclei, painting, whole

from napari_finetune.objects import (
    ChannelRole,
    object_instances,
    roles_from_metadata,
    roles_from_painting,
    roles_to_metadata,
    sources_from_metadata,
)
from napari_finetune.objects.from_painting import (
    DEFAULT,
    SET_BY_YOU,
    painted_objects,
    parameters_for,
    predicted_objects,
    user_set_from_sources,
)

ROLES = {"membrane": ChannelRole("boundary", min_size=200, seed_distance=8.0), "nuclei": TODAY}
NAMES = ["membrane", "nuclei"]


def test_painted_nuclei_give_sizes_that_keep_each_nucleus_whole_where_todays_split_it():
    prob, truth = nuclei()
    today = object_instances(prob, TODAY)
    assert today.max() == 4 and whole(today, truth) == [2, 2]  # each nucleus cut in two

    found = roles_from_painting(ROLES, painting(channel=1), NAMES)
    role = found.roles["nuclei"]
    assert role.seed_distance == pytest.approx(14.5)  # half the painted 29 voxels
    assert role.min_size == int(np.pi / 6 * 29**3 / 8)  # a ball half as wide
    labels = object_instances(prob, role)
    assert labels.max() == 2 and whole(labels, truth) == [1, 1]
    assert (labels[truth > 0] > 0).all()  # nothing of them dropped by the larger min size
    assert found.sources["nuclei"] == {
        "seed_distance": "from your painting (6 objects, median extent 29 voxels)",
        "min_size": "from your painting (6 objects, median extent 29 voxels)",
    }
    # A boundary channel's painted voxels are its boundary: nothing to measure there.
    assert found.roles["membrane"] == ROLES["membrane"]
    assert found.sources["membrane"] == {"seed_distance": DEFAULT, "min_size": DEFAULT}


def test_values_the_user_set_are_never_overridden():
    corrections = painting(channel=1)
    both = roles_from_painting(ROLES, corrections, NAMES,
                               user_set={"nuclei": {"seed_distance", "min_size"}})
    assert both.roles == ROLES
    assert both.sources["nuclei"] == {"seed_distance": SET_BY_YOU, "min_size": SET_BY_YOU}
    one = roles_from_painting(ROLES, corrections, NAMES, user_set={"nuclei": {"min_size"}})
    assert one.roles["nuclei"].min_size == TODAY.min_size
    assert one.roles["nuclei"].seed_distance == pytest.approx(14.5)
    assert one.sources["nuclei"]["min_size"] == SET_BY_YOU
    assert one.sources["nuclei"]["seed_distance"].startswith("from your painting")


@pytest.mark.parametrize("what", ["none", "nothing painted", "background only", "strokes only",
                                  "one object", "another channel"])
def test_without_painted_objects_the_values_are_todays_exactly(what):
    corrections: np.ndarray | None = np.zeros(SHAPE, np.uint8)
    assert corrections is not None
    if what == "none":
        corrections = None
    elif what == "background only":
        corrections[20, 10:40, 10:40] = 1
    elif what == "strokes only":  # a brush 3 wide, along an axis and diagonally
        corrections[20, 10:13, 10:70] = 3
        corrections[24, 40:43, 10:70] = 3
        for i in range(40):
            corrections[26, 20 + i:23 + i, 10 + i] = 3
    elif what == "one object":
        corrections = np.where(painting(channel=1, slices=(20,)) == 3, 3, 0).astype(np.uint8)
        corrections[:, 39:] = 0  # only the first nucleus's section (y < 39)
    elif what == "another channel":
        corrections = painting(channel=0)
    found = roles_from_painting(ROLES, corrections, NAMES)
    assert found.roles == ROLES
    assert found.sources == {c: {"seed_distance": DEFAULT, "min_size": DEFAULT} for c in ROLES}


def test_thin_strokes_beside_the_objects_do_not_shrink_their_size():
    corrections = painting(channel=0)
    for z in (10, 30):  # strokes drawn through nuclei and beside them
        corrections[z, 20:23, 10:80] = 2
        corrections[z, 40:70, 70:72] = 2
    painted = painted_objects(corrections, 0)
    assert painted.extent == pytest.approx(painted_objects(painting(channel=0), 0).extent)
    assert painted.count == 6  # the strokes are not objects


def test_touching_objects_painted_as_one_keep_one_objects_width():
    corrections = np.zeros((1, 40, 80), np.uint8)
    y, x = np.ogrid[:40, :80]
    for xc in (15, 35, 55):  # three discs 21 wide in a row, touching
        corrections[0][(y - 20) ** 2 + (x - xc) ** 2 <= 100] = 2
    corrections[0][(y - 20) ** 2 + (x - 70) ** 2 <= 4] = 2  # a click beside them
    stack = np.concatenate([corrections, np.zeros_like(corrections), corrections])
    painted = painted_objects(stack, 0)
    # Per slice the row and the click; the click's width (5) is in the smaller half.
    assert painted.count == 4
    assert painted.extent == pytest.approx(21, abs=2)  # one disc's, not the row's 61


def test_distances_are_in_the_finest_axis_and_sizes_in_the_volumes_voxels():
    corrections = painting(channel=0)
    iso = painted_objects(corrections, 0)
    # Sections twice as coarse in z: the in-plane widths are the same, a voxel holds twice
    # the volume, so half the voxels make the same min size.
    coarse_z = painted_objects(corrections, 0, voxel_size=(80, 40, 40))
    assert coarse_z.extent == pytest.approx(iso.extent)
    seed_iso, size_iso = parameters_for(iso, 3)
    seed_z, size_z = parameters_for(coarse_z, 3, voxel_size=(80, 40, 40))
    assert seed_z == seed_iso and size_z == pytest.approx(size_iso / 2, abs=1)
    # Pixels twice as wide in x: the widths measured in the finest axis's voxels (y).
    wide_x = painted_objects(corrections[:, :, ::2], 0, voxel_size=(40, 40, 80))
    assert wide_x.extent == pytest.approx(iso.extent, abs=2)


def test_sources_travel_with_the_roles_in_the_metadata():
    found = roles_from_painting(ROLES, painting(channel=1), NAMES,
                                user_set={"nuclei": {"min_size"}})
    metadata = roles_to_metadata(found.roles, {}, found.sources)
    assert roles_from_metadata(metadata, NAMES) == found.roles
    assert sources_from_metadata(metadata) == found.sources
    assert user_set_from_sources(sources_from_metadata(metadata)) == {
        "membrane": set(), "nuclei": {"min_size"}}
    # Roles written again without sources leave none of the earlier ones behind.
    assert sources_from_metadata(roles_to_metadata(ROLES, metadata)) == {}
    assert sources_from_metadata({}) == {}


def test_the_smallest_painted_objects_still_give_a_valid_role():
    corrections = np.zeros((1, 30, 30), np.uint8)
    for yc, xc in ((5, 5), (20, 20)):
        corrections[0, yc:yc + 3, xc:xc + 3] = 2  # 3 x 3 squares, the smallest counted
    found = roles_from_painting({"m": replace(TODAY, min_size=0)}, corrections, ["m"])
    assert (found.roles["m"].seed_distance, found.roles["m"].min_size) == (1.5, 1)
    found.roles["m"].validate("m")
    corrections[0, 20:23, 20:22] = 0  # 3 x 1: below MIN_AREA, a click, not an object
    assert roles_from_painting({"m": TODAY}, corrections, ["m"]).roles["m"] == TODAY


def _dabs(truth: np.ndarray, channel: int, z: int = 3) -> np.ndarray:
    """Brush dabs 5 voxels across inside each object on one slice: strokes, no outlines."""
    corrections = np.zeros(truth.shape, np.uint8)
    for k in np.unique(truth[z])[1:]:
        ys, xs = np.nonzero(truth[z] == k)
        cy, cx = int(ys.mean()), int(xs.mean())
        yy, xx = np.ogrid[:truth.shape[1], :truth.shape[2]]
        corrections[z][(yy - cy) ** 2 + (xx - cx) ** 2 <= 4] = channel + 2
    return corrections


def test_predicted_objects_measure_the_nuclei_not_the_specks():
    from tests.objects.speckled_nuclei import RADIUS, VOXEL_SIZE, speckled

    prob, _ = speckled()
    rng = np.random.default_rng(1)
    specks = rng.random(prob.shape) < 0.01  # single voxels above the threshold outside
    prob[specks & (prob < 0.4)] = 0.6
    found = predicted_objects(prob, 0.4, VOXEL_SIZE)
    # The widest section of a 25-voxel ball, touching pairs included (one piece, as
    # wide as one of them), not the specks' 1 voxel that most pieces are.
    assert found.extent == pytest.approx(2 * RADIUS, abs=1.5)
    assert found.count == 3  # two apart and the touching pair as one piece
    assert predicted_objects(np.zeros((4, 8, 8), np.float32), 0.5).count == 0


def test_strokes_inside_nuclei_give_way_to_the_predicted_sizes():
    """A user who paints dabs inside the nuclei (no outlines): the dabs are no objects
    (before, 4 dabs 5 voxels wide made the nuclei's seed distance 2.5 and cut each
    nucleus into pieces); the prediction's objects say the size instead."""
    from tests.objects.speckled_nuclei import VOXEL_SIZE, speckled

    prob, truth = speckled()
    sure = np.where(truth > 0, 0.95, 0.05).astype(np.float32)
    names = ["membrane", "nuclei"]
    dabs = _dabs(truth, channel=1)
    painted_only = roles_from_painting(ROLES, dabs, names, VOXEL_SIZE)
    assert painted_only.roles["nuclei"].seed_distance < 4  # the dabs taken for objects
    found = roles_from_painting(ROLES, dabs, names, VOXEL_SIZE,
                                probabilities={"nuclei": sure})
    role = found.roles["nuclei"]
    assert role.seed_distance == pytest.approx(12.0, abs=1.0)
    assert found.sources["nuclei"]["seed_distance"].startswith("from the prediction (3 objects")
    labels = object_instances(prob, replace(role, seed_threshold=None), VOXEL_SIZE)
    assert np.unique(labels[truth > 0]).size - (0 in labels[truth > 0]) == 4


def test_predicted_objects_of_the_size_the_values_are_for_keep_the_values():
    # Objects about two seed distances wide: the values came with the model, chosen by
    # measurement on its own objects; they stay, and say default.
    from tests.objects.speckled_nuclei import VOXEL_SIZE, speckled

    prob, _ = speckled()
    role = ChannelRole("object", threshold=0.4, min_size=100, seed_distance=10.0, split=True)
    found = roles_from_painting({"nuclei": role}, None, ["nuclei"], VOXEL_SIZE,
                                probabilities={"nuclei": prob})
    assert found.roles["nuclei"] == role
    assert found.sources["nuclei"] == {"seed_distance": DEFAULT, "min_size": DEFAULT}
