"""``benchmarks/bench_instances.py`` runs end to end on a small sample and prints its tables."""

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_instances.py"


def test_bench_instances_prints_its_tables(tmp_path):
    env = dict(os.environ, NAPARI_FINETUNE_CACHE=str(tmp_path / "cache"))
    cmd = [sys.executable, str(BENCH), "--shape", "16", "64", "64", "--cache", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env,
                          cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for header in ("| model | cells: roles |", "| model | mitochondria: roles |",
                   "| model | step (whole volume, default roles) |",
                   "| volume (scored voxels) | model | cells: adapted Rand error |"):
        assert header in out, out
    assert "| before | default |" in out
    for volume in ("second volume (target seed 2), unpainted", "unseen appearance"):
        assert f"| {volume}" in out and "| semantic truth, blurred |" in out, out
    assert list(tmp_path.glob("probs_*_16x64x64.npy"))  # the prediction was cached
