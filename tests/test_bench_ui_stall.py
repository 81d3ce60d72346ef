"""``benchmarks/bench_ui_stall.py``: napari's layer work is taken out of the gaps it falls in.

The walk's goal (issue 55) counts the plugin's main-thread gaps, not napari's
own building and adding of layers, which opening a sample runs in the same
turn as the plugin's function.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """``bench_ui_stall`` imported as the script imports it (its folder on ``sys.path``)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_ui_stall

    return bench_ui_stall


def test_a_gap_loses_the_napari_work_inside_it(bench):
    ticks = [0.0, 0.01, 1.01, 1.02, 1.52]
    # napari worked 0.2-0.9 s (inside the long gap) and 1.3-1.6 s (across the last tick).
    spans = [(0.2, 0.9), (1.3, 1.6)]
    got = bench.gaps_outside_ms(ticks, spans)
    np.testing.assert_allclose(got, [10.0, 300.0, 10.0, 280.0])


def test_nested_work_is_counted_once(bench):
    work = bench.NapariLayerWork.__new__(bench.NapariLayerWork)  # no napari classes wrapped
    work.built = [(1.0, 1.5), (3.0, 3.1)]
    work.added = [(1.2, 2.0)]  # a Labels layer built inside an add: one interval
    work.removed = [(3.05, 3.3)]  # a removal that began inside a build: joined to it
    assert work.intervals() == [(1.0, 2.0), (3.0, 3.3)]
    assert work.summary() == ("2 built: 600 ms (max 500); 1 added: 800 ms (max 800); "
                              "1 removed: 250 ms (max 250)")


def test_the_wrapped_napari_methods_are_restored(bench):
    from napari.components import LayerList
    from napari.layers import Image, Labels

    before = [Image.__dict__["__init__"], Labels.__dict__["__init__"],
              LayerList.__dict__["insert"]]
    work = bench.NapariLayerWork()
    try:
        layers = LayerList()
        layers.append(Image(np.zeros((4, 4), np.uint8)))
        assert len(work.built) == 1 and len(work.added) == 1
    finally:
        work.restore()
    assert [Image.__dict__["__init__"], Labels.__dict__["__init__"],
            LayerList.__dict__["insert"]] == before


def test_a_late_heartbeat_leaves_every_threads_stack_and_a_late_line(bench, tmp_path):
    out = tmp_path / "gil.txt"
    watch = bench.GilWatch(out, late_s=0.05)
    watch.step = "a step"
    try:
        watch.tick()
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:  # a late heartbeat: this thread busy, GIL held
            pass
        watch.tick()
    finally:
        watch.pause()
    text = out.read_text()
    # The stacks (the main thread's in its busy loop), then the late line.
    assert "ms late, in a step" in text and "test_a_late_heartbeat_leaves" in text
    late = [line for line in text.splitlines() if line.startswith("# late")]
    assert len(late) == 1 and late[0].endswith("in a step")
    assert int(late[0].split()[2]) >= 300


def test_no_dump_while_the_heartbeat_keeps_time(bench, tmp_path):
    out = tmp_path / "gil.txt"
    watch = bench.GilWatch(out, late_s=0.5)
    try:
        for _ in range(3):
            watch.tick()
    finally:
        watch.pause()
    assert out.read_text() == ""
