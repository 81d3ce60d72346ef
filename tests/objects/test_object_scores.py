"""The scores the instance benchmark reports, on cases worked out by hand."""

import numpy as np
import pytest

from napari_finetune.objects.scores import matched_objects, object_scores, region_scores


def test_objects_match_one_to_one_above_half_iou():
    true = np.zeros((1, 10, 30), np.uint32)
    true[0, 2:8, 0:6] = 1  # 36 voxels
    true[0, 2:8, 10:16] = 2
    true[0, 2:8, 20:26] = 3
    pred = np.zeros_like(true)
    pred[0, 2:8, 0:6] = 7  # exact
    pred[0, 2:8, 10:13] = 8  # half of object 2: IoU 0.5, not a match
    pred[0, 0:2, 27:30] = 9  # nothing there
    rows = matched_objects(pred, true)
    assert rows.tolist() == [[1, 7, 1.0]]
    s = object_scores(pred, true)
    assert (s["n_true"], s["n_pred"], s["matched"]) == (3, 3, 1)
    assert s["precision"] == pytest.approx(1 / 3) and s["recall"] == pytest.approx(1 / 3)
    assert s["f1"] == pytest.approx(1 / 3) and s["count_error"] == 0.0
    pred[0, 2:8, 13:16] = 8  # now the whole of it
    assert object_scores(pred, true)["matched"] == 2
    with pytest.raises(ValueError, match="iou must be in"):
        matched_objects(pred, true, iou=0.3)


def test_region_scores_tell_splits_from_merges_and_ignore_the_boundary():
    true = np.zeros((1, 4, 9), np.uint32)
    true[..., :4] = 1
    true[..., 5:] = 2  # column 4 is membrane (0)
    same = true.copy()
    same[..., 4] = 5  # what a segmentation puts on the membrane does not count
    s = region_scores(same, true)
    assert s["adapted_rand_error"] == pytest.approx(0) and s["voi_split"] == pytest.approx(0)
    merged = np.ones_like(true)
    m = region_scores(merged, true)
    assert m["voi_merge"] == pytest.approx(1.0) and m["voi_split"] == pytest.approx(0)
    assert m["adapted_rand_error"] > 0.3
    split = true.copy()
    split[..., 2:4] = 3
    s = region_scores(split, true)
    assert s["voi_split"] > 0.4 and s["voi_merge"] == pytest.approx(0)


def test_scores_by_role_scores_cells_as_regions_and_objects_as_visible_blobs():
    from napari_finetune.objects import ChannelRole
    from napari_finetune.objects.scores import scores_by_role

    cells = np.zeros((1, 4, 8), np.uint32)
    cells[0, :, :4], cells[0, :, 4:] = 1, 2
    semantic = np.zeros((1, 4, 8), np.uint8)
    semantic[0, 1:3, 1:7] = 2  # one blob of class 2 (channel 1) across both cells
    merged = np.ones((1, 4, 8), np.uint32)
    blob = (semantic == 2).astype(np.uint32)
    roles = {"membrane": ChannelRole("boundary"), "mito": ChannelRole("object")}
    got = scores_by_role({"membrane": merged, "mito": blob}, roles, ["membrane", "mito"],
                         cells, semantic)
    assert got["membrane"]["voi_merge"] == pytest.approx(1.0)  # two cells in one: 1 bit
    assert got["membrane"]["voi_split"] == 0.0
    assert got["mito"]["f1"] == 1.0 and got["mito"]["n_true"] == 1
    # Without the cell truth the boundary channel has no score.
    assert set(scores_by_role({"membrane": merged}, roles, ["membrane", "mito"], None,
                              semantic)) == set()


def test_cells_a_user_counts_are_the_ones_the_objects_step_keeps():
    # Two true cells of 40 voxels and three of one voxel each (cells that show one voxel
    # between membranes): 2 cells at min_size 10, 5 ids in all.
    true = np.zeros((4, 10, 10), np.int64)
    true[:, :5, :2] = 1
    true[:, 5:, :2] = 2
    true[0, 0, 9], true[1, 0, 9], true[2, 0, 9] = 3, 4, 5
    pred = np.where(true > 0, 1, 0)
    s = region_scores(pred, true, min_size=10)
    assert (s["n_true"], s["n_true_any"], s["n_pred"]) == (2, 5, 1)
    assert region_scores(pred, true)["n_true"] == 5  # without a size, every id
