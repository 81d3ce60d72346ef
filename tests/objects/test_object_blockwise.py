"""Blockwise instance labels: one id per object across blocks, equal to one piece, bounded reads."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from array_readers import CountingReader
from napari_finetune.objects import ChannelRole, boundary_instances, object_instances, segment
from napari_finetune.objects.blockwise import blockwise_instances, default_halo

OBJECT = ChannelRole("object", threshold=0.5, min_size=0)


def same_up_to_relabelling(a: np.ndarray, b: np.ndarray) -> bool:
    """Background in the same voxels, and one-to-one ids between a and b."""
    if not np.array_equal(a > 0, b > 0):
        return False
    pairs = np.unique(np.stack([a[a > 0], b[b > 0]]), axis=1)
    return pairs.shape[1] == np.unique(a[a > 0]).size == np.unique(b[b > 0]).size


def run(prob, params, block, halo=None):
    out = np.zeros(prob.shape, np.uint32)
    n = blockwise_instances(prob, params, block, out, halo=halo)
    return out, n


def blobs(shape, seed, sigma=2.0, level=0.62):
    noise = ndimage.gaussian_filter(np.random.default_rng(seed).random(shape), sigma)
    return ((noise - noise.min()) / np.ptp(noise) > level).astype(np.float32)


def test_an_object_crossing_two_blocks_and_one_at_a_corner_of_four_get_one_id_each():
    prob = np.zeros((8, 32, 32), np.float32)
    prob[2:6, 10:22, 3:8] = 1  # crosses the y border at 16 (two blocks)
    prob[2:6, 12:20, 12:20] = 1  # crosses y=16 and x=16: four blocks at a corner
    prob[2:6, 25:30, 25:30] = 1  # inside one block
    for params in (OBJECT, ChannelRole("object", split=True, seed_distance=2.0)):
        out, n = run(prob, params, (8, 16, 16))
        assert n == 3, params
        assert np.unique(out[2:6, 10:22, 3:8]).tolist() != [0]
        for box in [(slice(2, 6), slice(10, 22), slice(3, 8)),
                    (slice(2, 6), slice(12, 20), slice(12, 20)),
                    (slice(2, 6), slice(25, 30), slice(25, 30))]:
            assert np.unique(out[box]).size == 1 and out[box].min() > 0
        assert sorted(np.unique(out)) == [0, 1, 2, 3]  # ids 1..N, none used twice


def test_ids_are_unique_across_blocks():
    """Objects inside different blocks never share an id (each block's ids are offset)."""
    prob = np.zeros((4, 40, 40), np.float32)
    for y in range(2, 40, 10):
        for x in range(2, 40, 10):
            prob[1:3, y:y + 4, x:x + 4] = 1  # 16 objects, one per 10x10 block
    out, n = run(prob, OBJECT, (4, 10, 10))
    assert n == 16
    assert np.unique(out[out > 0]).size == 16
    assert ndimage.label(prob)[1] == 16


@pytest.mark.parametrize("shape,block", [((20, 48, 40), (8, 16, 16)), ((33, 50), (10, 7))])
def test_object_channel_blockwise_equals_one_piece_exactly(shape, block):
    prob = blobs(shape, seed=1, sigma=1.5)
    params = ChannelRole("object", threshold=0.5, min_size=30 if len(shape) == 3 else 3)
    whole = object_instances(prob, params)
    out, n = run(prob, params, block)
    assert n == int(whole.max()) > 4
    assert same_up_to_relabelling(out, whole)


def cells(shape, n_seeds, seed, wall=1):
    """Voronoi cells with closed walls ``wall`` voxels thick: prob 1 on the walls."""
    rng = np.random.default_rng(seed)
    points = np.zeros(shape, np.int32)
    for k in range(1, n_seeds + 1):
        points[tuple(rng.integers(0, s) for s in shape)] = k
    where = ndimage.distance_transform_edt(points == 0, return_distances=False,
                                           return_indices=True)
    regions = points[tuple(where)]
    walls = np.zeros(shape, bool)
    for axis in range(len(shape)):
        walls |= np.diff(regions, axis=axis, prepend=np.take(regions, [0], axis=axis)) != 0
    if wall > 1:
        walls = ndimage.binary_dilation(walls, iterations=wall - 1)
    return walls.astype(np.float32)


def test_boundary_channel_with_closed_walls_equals_one_piece():
    """Cells whose walls are closed are one interior region each; one holding a single
    seed is that seed's, whole, in a block's view as in the volume's, so here (thick
    walls, convex cells) the blockwise labels are the one-piece ones."""
    prob = cells((24, 64, 64), 12, seed=3, wall=2)
    params = ChannelRole("boundary", threshold=0.5, min_size=20, seed_distance=2.0)
    whole = boundary_instances(prob, params)
    out, n = run(prob, params, (12, 24, 24))
    assert n == int(whole.max()) > 5
    assert same_up_to_relabelling(out, whole)


def test_boundary_channel_with_gaps_keeps_the_interior_and_one_id_per_region():
    """What can differ: with gaps in the walls, a region's seeds, or the path joining two
    pieces of it, may lie beyond a block's halo, so the cut between cells joined through a
    gap (and, rarely, whether two pieces are one cell) can differ from the one-piece labels.

    What must hold: the same voxels are interior (labelled) before min_size, ids are
    1..N with none used twice, and an interior region without gaps that crosses block
    borders has one id."""
    prob = cells((24, 64, 64), 14, seed=4, wall=1)
    rng = np.random.default_rng(0)
    prob[rng.random(prob.shape) < 0.05] = 0.0  # holes in the walls
    params = ChannelRole("boundary", threshold=0.5, min_size=0, seed_distance=2.0)
    whole = boundary_instances(prob, params)
    out, n = run(prob, params, (12, 24, 24))
    assert np.array_equal(out > 0, whole > 0)
    assert sorted(np.unique(out[out > 0])) == list(range(1, n + 1))
    # Most regions are the same: at least 80 % of the one-piece regions are matched
    # one-to-one (IoU > 0.9) by a blockwise one.
    matched = 0
    for k in range(1, int(whole.max()) + 1):
        ids, counts = np.unique(out[whole == k], return_counts=True)
        best = ids[np.argmax(counts)]
        inter = counts.max()
        union = (whole == k).sum() + (out == best).sum() - inter
        matched += inter / union > 0.9
    assert matched >= 0.8 * whole.max()


def test_reads_are_bounded_by_block_and_halo():
    prob = cells((32, 64, 64), 10, seed=5, wall=2)
    # The boundary halo is 6 seed distances: at 1 (6 voxels) a block and its halo are
    # still well under the volume, so the bound below says something.
    params = ChannelRole("boundary", seed_distance=1.0)
    halo = default_halo(params, 3)
    reader = CountingReader(prob)
    out = np.zeros(prob.shape, np.uint32)
    blockwise_instances(reader, params, (16, 32, 32), out)
    largest = int(np.prod([b + 2 * h + 1 for b, h in zip((16, 32, 32), halo, strict=True)]))
    assert len(reader.reads) == 8
    assert max(reader.reads) <= largest < prob.size
    assert np.array_equal(out > 0, boundary_instances(prob, params) > 0)
    # An object channel reads the core only: no halo is needed to merge its faces.
    reader.reads.clear()
    blockwise_instances(reader, OBJECT, (16, 32, 32), out)
    assert max(reader.reads) == 16 * 32 * 32


def test_too_many_ids_is_one_clear_error(monkeypatch):
    prob = np.zeros((4, 20, 20), np.float32)
    prob[:, ::4, ::4] = 1  # 100 one-voxel objects per z... separated
    monkeypatch.setattr(segment, "MAX_ID", 10)
    with pytest.raises(ValueError, match="overflow uint32") as info:
        run(prob, OBJECT, (4, 10, 10))
    assert "\n" not in str(info.value)


def test_bad_arguments_are_one_line_errors():
    prob = np.zeros((4, 8, 8), np.float32)
    with pytest.raises(ValueError, match="uint32"):
        blockwise_instances(prob, OBJECT, (4, 4, 4), np.zeros(prob.shape, np.uint8))
    with pytest.raises(ValueError, match="no instance role"):
        run(prob, ChannelRole(), (4, 4, 4))
    with pytest.raises(ValueError, match="halo"):
        run(prob, ChannelRole("boundary"), (4, 4, 4), halo=(0, 0, 0))


def test_objects_split_at_cores_are_the_one_piece_objects_across_a_block_border():
    """Two sure balls bridged across a block border: cut where the bridge is faintest."""
    zz, yy, xx = np.indices((16, 16, 64))
    a = (zz - 8) ** 2 + (yy - 8) ** 2 + (xx - 12) ** 2 <= 5**2
    b = (zz - 8) ** 2 + (yy - 8) ** 2 + (xx - 44) ** 2 <= 5**2
    rod = ((zz - 8) ** 2 + (yy - 8) ** 2 <= 3**2) & (xx > 12) & (xx < 44) & ~a & ~b
    # Faintest at x = 36, away from the block border at 32, as a bridge need not be.
    bridge = 0.5 + 0.3 * np.abs(xx - 36) / 24
    prob = np.where(a | b, 0.95, np.where(rod, bridge, 0.05)).astype(np.float32)
    # The halo (4 seed distances, 16 voxels) reaches the other ball's core from
    # each block, so both blocks place the cut where the one piece does.
    params = ChannelRole("object", threshold=0.4, split=True, seed_threshold=0.9,
                         seed_distance=4.0)
    whole = object_instances(prob, params)
    assert whole.max() == 2 and np.unique(whole[:, :, 37:]).tolist() == [0, whole[8, 8, 44]]
    out, n = run(prob, params, (16, 16, 32))
    assert n == 2 and same_up_to_relabelling(out, whole)


@pytest.mark.parametrize("border", [26, 30, 34])
@pytest.mark.parametrize("faintest", [27, 30, 33])
def test_a_bridge_across_a_border_inside_both_read_regions_is_cut_as_in_one_piece(
        border, faintest):
    """Cores on either side of a block border, the bridge's faintest place on either side
    of it or on it: the whole component lies in both blocks' read regions (core + halo),
    so both label it as the one piece does and the halo agreement joins it exactly."""
    zz, yy, xx = np.indices((12, 12, 60))
    a = (zz - 6) ** 2 + (yy - 6) ** 2 + (xx - 22) ** 2 <= 3**2
    b = (zz - 6) ** 2 + (yy - 6) ** 2 + (xx - 38) ** 2 <= 3**2
    rod = ((zz - 6) ** 2 + (yy - 6) ** 2 <= 2**2) & (xx > 22) & (xx < 38) & ~a & ~b
    bridge = 0.5 + 0.35 * np.abs(xx - faintest) / 14
    prob = np.where(a | b, 0.95, np.where(rod, bridge, 0.05)).astype(np.float32)
    params = ChannelRole("object", threshold=0.4, split=True, seed_threshold=0.9,
                         seed_distance=4.0)
    whole = object_instances(prob, params)
    assert whole.max() == 2 and whole[6, 6, faintest + 1] == whole[6, 6, 38]
    assert whole[6, 6, faintest] != whole[6, 6, faintest + 1] or \
        whole[6, 6, faintest - 1] != whole[6, 6, faintest]
    halo = default_halo(params, 3)
    assert border - halo[2] <= 19 and border + halo[2] > 41  # x 19..41 read by both
    out, n = run(prob, params, (12, 12, border))
    assert n == 2 and same_up_to_relabelling(out, whole)


def test_blockwise_objects_use_the_voxel_size():
    # Two cells joined by a neck, four 40 nm sections thick: one region in voxels, two in nm.
    prob = np.ones((16, 48, 48), np.float32)
    prob[6:10, 4:44, 4:22] = 0
    prob[6:10, 4:44, 26:44] = 0
    prob[6:10, 20:28, 22:26] = 0
    role = ChannelRole("boundary", seed_distance=4, min_size=0)
    for voxel_size, cells in ((None, 1), ((40, 8, 8), 2)):
        out = np.zeros(prob.shape, np.uint32)
        n = blockwise_instances(prob, role, (16, 48, 48), out, voxel_size=voxel_size)
        assert n == cells
        np.testing.assert_array_equal(out > 0, boundary_instances(prob, role, voxel_size) > 0)


def test_thick_sections_blockwise_equal_one_piece():
    """Thick sections (cells made section by section, linked across z): split along z the
    result is exact, since a block and the one above make the same cells on the sections
    both see and decide each link from two sections alone; split in y and x too it is
    exact here (closed walls, cells within the halo)."""
    voxel_size = (40, 4, 4)
    prob = cells((12, 64, 64), 12, seed=5, wall=1)
    params = ChannelRole("boundary", threshold=0.5, min_size=20, seed_distance=2.0)
    assert default_halo(params, 3, voxel_size)[0] == 2 < default_halo(params, 3)[0]
    whole = boundary_instances(prob, params, voxel_size)
    assert whole.max() > 5
    gapped = prob.copy()
    gapped[np.random.default_rng(1).random(prob.shape) < 0.05] = 0.0  # holes in the walls
    gapped_whole = boundary_instances(gapped, params, voxel_size)
    for volume, expected, block in ((prob, whole, (3, 64, 64)), (prob, whole, (4, 32, 32)),
                                    (gapped, gapped_whole, (1, 64, 64))):
        out = np.zeros(volume.shape, np.uint32)
        n = blockwise_instances(volume, params, block, out, voxel_size=voxel_size)
        assert n == int(expected.max()), block
        assert same_up_to_relabelling(out, expected), block


def test_touching_nuclei_on_few_thick_sections_blockwise_equal_one_piece():
    """The depth within each section, which keeps two touching nuclei apart on a few
    thick sections, gives blocks the same objects as the whole volume."""
    from tests.objects.speckled_nuclei import PAIR_ROLE, pair_on_few_sections

    voxel_size = (1000, 200, 200)
    prob = pair_on_few_sections()
    whole = object_instances(prob, PAIR_ROLE, voxel_size)
    assert whole.max() == 2
    for block in ((7, 80, 150), (7, 80, 75), (4, 40, 75)):
        out = np.zeros(prob.shape, np.uint32)
        n = blockwise_instances(prob, PAIR_ROLE, block, out, voxel_size=voxel_size)
        assert n == 2, block
        assert same_up_to_relabelling(out, whole), block
