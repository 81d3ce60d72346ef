"""``benchmarks/bench_bf16_cpu.py``: its core, on a tiny UNet in fp32, in this process."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
TINY = {"model": {"dims": 3, "depth": 1, "features": 4}, "shape": [1, 4, 8, 8],
        "steps": 2, "bf16": False, "threads": 1}


@pytest.fixture
def bench(monkeypatch):
    """``bench_bf16_cpu`` imported as the script imports it (its folder on ``sys.path``)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_bf16_cpu

    yield bench_bf16_cpu
    # the run sets these process-wide; put back the defaults the other tests expect
    torch.use_deterministic_algorithms(False)
    torch.backends.mkldnn.enabled = True


def test_a_tiny_fp32_run_gives_the_rate_table_row(bench):
    runs = [bench.train_run(TINY), bench.train_run(TINY)]
    for run in runs:
        assert len(run["losses"]) == len(run["norms"]) == 2
        assert all(math.isfinite(v) and v > 0 for v in run["losses"] + run["norms"])
        assert run["bad_step"] is None and run["where"] == {}
    # BCE of random logits against coin-flip targets starts near ln 2
    assert 0.3 < runs[0]["losses"][0] < 3
    row = bench.rate_row("fp32", runs)
    assert len(row) == len(bench.RATE_HEADER)
    # same seed, one process, fp32: one trajectory; none went bad
    assert row[:5] == ["fp32", "2", "0/2", "-", "1"]


def test_a_bad_run_is_counted_with_its_step(bench):
    good = bench.train_run(TINY)
    broken = {**good, "losses": [1.0, None], "bad_step": 1}
    row = bench.rate_row("bf16", [good, broken, {"error": "killed"}])
    assert row[1:5] == ["2 (+1 failed)", "1/2", "1", "2"]


def test_the_hooks_name_the_module_that_first_goes_huge(bench):
    from napari_finetune.model.unet import UNet

    model = UNet(dims=3, depth=1, features=4)
    with torch.no_grad():
        model.decoders[0][0].weight.mul_(1e30)  # its output overflows past 1e19
    watch = bench.Watch(model)
    model(torch.randn(1, 1, 4, 8, 8)).sum().backward()
    found = watch.found["forward"]
    assert found["module"] == "decoders.0.0" and found["type"] == "Conv3d"
    assert found["input_shape"] == [1, 8, 4, 8, 8]
    rows = bench.where_rows("x", [{"where": watch.found}])
    assert ["x", "0", "0", "forward", "decoders.0.0", "Conv3d", "1x8x4x8x8"] in rows
