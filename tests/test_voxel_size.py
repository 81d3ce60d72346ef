"""The voxel size rules: validation, anisotropy, pooling, the trained voxel size, the warning."""

from __future__ import annotations

import pytest

from napari_finetune.voxel_size import (
    differs,
    mismatch_line,
    parse_voxel_size,
    pooling_factors,
    sampling,
    trained_voxel_size,
)


def test_parse_and_reject():
    assert parse_voxel_size("40,8,8") == (40.0, 8.0, 8.0)
    assert parse_voxel_size("40x8x8") == (40.0, 8.0, 8.0)
    for bad in ("40,a,8", "0,8,8", "8"):
        with pytest.raises(ValueError, match="voxel") as info:
            parse_voxel_size(bad)
        assert "\n" not in str(info.value)


def test_sampling_is_relative_to_the_finest_axis_and_none_when_isotropic():
    assert sampling((40, 8, 8), 3) == (5.0, 1.0, 1.0)
    assert sampling((40, 8, 8), 2) is None  # a 2D image of it: Y, X alike
    assert sampling((8, 8, 8.5), 3) is None  # within 10 %
    assert sampling(None, 3) is None


def test_pooling_skips_the_coarse_axis_until_it_is_about_the_finest():
    assert pooling_factors((40, 8, 8), 3, 3) == [[1, 2, 2], [1, 2, 2], [2, 2, 2]]
    assert pooling_factors((1000, 200, 200), 4, 3) == [[1, 2, 2], [1, 2, 2], [2, 2, 2],
                                                       [2, 2, 2]]
    assert pooling_factors((8, 8, 8), 3, 3) == [[2, 2, 2]] * 3
    assert pooling_factors(None, 2, 2) == [[2, 2]] * 2


def test_the_trained_voxel_size_is_the_last_known_runs():
    assert trained_voxel_size({}) is None
    run = {"config": {"voxel_size": [40, 8, 8]}}
    assert trained_voxel_size({"run": run}) == (40.0, 8.0, 8.0)
    # A later run at an unknown voxel size keeps the earlier one's.
    later = {"config": {"voxel_size": None}, "previous_run": run}
    assert trained_voxel_size({"run": later}) == (40.0, 8.0, 8.0)


def test_a_difference_over_ten_percent_on_one_axis_is_one_warning_line():
    assert not differs((40, 8, 8), (42, 8.5, 8.5))
    assert differs((40, 8, 8), (40, 4, 4))
    assert mismatch_line((40, 8, 8), None) is None and mismatch_line(None, (4, 4, 4)) is None
    line = mismatch_line((40, 8, 8), (40, 4, 4))
    assert line is not None and "\n" not in line
    assert line.startswith("warning:") and "40 x 8 x 8" in line and "40 x 4 x 4" in line
