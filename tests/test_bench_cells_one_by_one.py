"""``benchmarks/cells_one_by_one.py``: the CREMI cells listed one by one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from napari_finetune.samples.real import CATALOGUE, RealVolume

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """``cells_one_by_one`` imported as the script is run (its folder on ``sys.path``)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import cells_one_by_one

    return cells_one_by_one


def _two_cells_one_predicted() -> tuple[RealVolume, np.ndarray]:
    """Two true cells side by side on z = 4 (CREMI's labelled slice) of the scored half;
    one predicted cell holds both."""
    shape = (9, 20, 40)
    truth = np.zeros(shape, np.uint32)
    truth[4, 2:18, 22:30] = 5
    truth[4, 2:18, 30:38] = 6
    known = truth > 0
    everything = slice(0, None)
    spec = CATALOGUE["cremi"]
    volume = RealVolume(spec, np.zeros(shape, np.uint8), truth, known,
                        (everything, everything, slice(0, 20)),
                        (everything, everything, slice(20, 40)))
    pred = np.zeros(shape, np.uint32)
    pred[:, 2:18, 22:38] = 3
    return volume, pred


def test_the_outlines_are_both_sides_of_every_edge_of_a_labelled_cell(bench):
    truth = np.zeros((6, 8), np.uint32)
    truth[1:5, 1:4] = 1
    truth[1:5, 4:7] = 2
    edge = bench.true_outlines(truth)
    assert edge[2, 3] and edge[2, 4]  # between the two cells
    assert edge[1, 2] and edge[0, 2]  # against the unlabelled pixels around
    assert not edge[2, 2] and not edge[2, 5]  # inside


def test_a_merged_pair_shows_as_one_predicted_cell_covering_two_true_ones(bench):
    volume, pred = _two_cells_one_predicted()
    lines = bench.one_by_one(pred, volume)
    assert "  true 5: 128 / 128; counted; 3 128 [100%]" in lines
    assert "  pred 3: 256 / 256 (100%); counted; 5 128, 6 128" in lines
    # The merge costs VOI merge (log2 of 2 cells in one), no split; one cell for two.
    assert lines[-1].startswith("adapted Rand error ")
    assert "VOI split 0.000, merge 1.000; counted 1 / 2" in lines[-1]
