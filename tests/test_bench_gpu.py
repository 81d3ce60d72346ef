"""``benchmarks/bench_gpu.py --cpu-dry-run``: the GPU benchmark's every part, on the CPU.

The script runs the first time a GPU is lent, with minutes of GPU time: a broken
script there loses them. Slow (2-3 minutes): ``make test-all`` runs it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"


@pytest.mark.slow
def test_the_gpu_benchmark_runs_every_part_on_the_cpu():
    done = subprocess.run([sys.executable, str(BENCH), "--cpu-dry-run"], capture_output=True,
                          text=True, timeout=900, cwd=BENCH.parent)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    titles = ["0. default run on cpu", "1. step speed", "=> PASS: 4/4 steps", "3. memory",
              "4. autobatch against the real limit", "5. Finetuner vs a bare",
              "6. time to quality", "7. prediction"]
    for title in titles:
        assert title in out, title
    assert "FAIL" not in out
