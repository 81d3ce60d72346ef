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
              "6. time to quality", "7. prediction", "8. the CUDA fake's argument matrix",
              "9. host syncs per attempt", "precision probe"]
    for title in titles:
        assert title in out, title
    assert "FAIL" not in out


# --- the script's own logic, fast: bench_gpu imported in this process ---------------


@pytest.fixture
def bench(monkeypatch):
    """``bench_gpu`` imported as the script imports it (its folder on ``sys.path``)."""
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import bench_gpu

    return bench_gpu


def test_it_imports_without_napari_qt_zarr_or_dask():
    """The GPU machine has torch, numpy, scipy, scikit-image, peft, tqdm, and none of these."""
    from import_blocker import run_without

    run_without(["napari", "qtpy", "PyQt5", "PyQt6", "PySide2", "PySide6", "zarr", "dask"],
                f"""
                sys.path.insert(0, {str(BENCH.parent)!r})
                import bench_gpu, bench_trainer_throughput
                from napari_finetune.trainer import loop, recovery
                """)


def test_a_failing_part_does_not_stop_the_next_ones(bench, capsys):
    from napari_finetune.trainer.recovery import RecoveryError

    ran = []

    def recovery_error():
        ran.append("oom")
        raise RecoveryError("out of memory at batch 1 with nothing left to give up")

    def reports_fail():
        ran.append("autobatch")
        return False

    results = bench.run_parts([
        ("oom", recovery_error), ("autobatch", reports_fail), ("bare", lambda: ran.append("bare")),
    ])
    assert ran == ["oom", "autobatch", "bare"]
    assert results == [
        ("oom", "FAIL (RecoveryError: out of memory at batch 1 with nothing left to give up)"),
        ("autobatch", "FAIL"),
        ("bare", "done"),
    ]
    out, err = capsys.readouterr()
    assert "oom: FAILED, RecoveryError: out of memory at batch 1" in out
    assert "Traceback" in err and "RecoveryError" in err  # the whole story, on stderr


def test_main_goes_on_after_a_failed_part_and_exits_non_zero(bench, monkeypatch, capsys):
    from napari_finetune.trainer.recovery import RecoveryError

    ran = []
    monkeypatch.setattr(bench, "make_data", lambda shape: (None, None))

    def speed(*_args):
        raise RecoveryError("out of memory with nothing left to give up")

    monkeypatch.setattr(bench, "speed", speed)
    monkeypatch.setattr(bench, "prediction_speed", lambda *a: ran.append("predict"))
    assert bench.main(["--cpu-dry-run", "--parts", "speed", "predict"]) == 1
    assert ran == ["predict"]
    out = capsys.readouterr().out
    assert "| speed | FAIL (RecoveryError: out of memory with nothing left to give up) |" in out
    assert "| predict | done |" in out
    assert out.rstrip().endswith("failed: speed")
    assert bench.main(["--cpu-dry-run", "--parts", "predict"]) == 0


def test_the_fp32_rows_run_with_tf32_off_and_it_is_put_back(bench, monkeypatch, capsys):
    import torch

    seen = []

    class Last:
        dtype, grad_scaler, batch_size, accumulation = "float32", False, 2, 1

    def timed_run(image, corrections, config):
        seen.append((config.mixed_precision, config.mode, torch.backends.cuda.matmul.allow_tf32,
                     torch.backends.cudnn.allow_tf32))
        return 0.5, [Last()]

    monkeypatch.setattr(bench, "timed_run", timed_run)
    # Set and put back by hand: torch's flags are no plain attributes for monkeypatch.
    # The old switches move the newer fp32_precision settings (which change CPU bf16
    # results in later tests of this process): those are put back as well.
    newer = [
        (module, module.fp32_precision)
        for module in (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
        if hasattr(module, "fp32_precision")
    ]
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        precisions = [(m, m.fp32_precision) for m, _ in newer]
        bench.speed(None, None, "cpu", 4, 2, (8, 32, 32))
        after = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        precisions_after = [(m, m.fp32_precision) for m, _ in newer]
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
        for module, value in newer:
            module.fp32_precision = value
    assert seen == [(False, "full", False, False), (True, "full", True, True)]
    assert after == (True, True) and precisions_after == precisions
    # From a fresh process's state too (matmul "none": the old switch never set).
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        fresh = matmul.fp32_precision
        try:
            matmul.fp32_precision = "none"
            bench.speed(None, None, "cpu", 4, 2, (8, 32, 32))
            untouched = matmul.fp32_precision
        finally:
            matmul.fp32_precision = fresh
        assert untouched == "none"
    out = capsys.readouterr().out
    assert "| fp32 (TF32 off) |" in out and "TF32 off" in out.splitlines()[0]
    assert "full fine-tune" in out.splitlines()[0]


def test_part_2_lifts_the_allocator_cap_even_when_the_run_raises(bench, monkeypatch):
    import torch

    from napari_finetune.trainer.recovery import RecoveryError

    fractions = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda f, *a: fractions.append(f))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 2**30)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda *a: type("Props", (), {"total_memory": 80 * 2**30}))
    runs = []

    def timed_run(image, corrections, config, after_build=None):
        runs.append(config.batch_size)
        if len(runs) == 2:  # the capped run
            assert fractions and fractions[-1] < 1.0
            raise RecoveryError("out of memory at batch 1 with nothing left to give up")
        return 0.1, []

    monkeypatch.setattr(bench, "timed_run", timed_run)
    with pytest.raises(RecoveryError):
        bench.oom_recovery(None, None, "cpu", 16, (8, 32, 32), dry_run=False)
    assert runs == [1, 16] and fractions[-1] == 1.0


def test_the_bare_loop_builds_its_optimizer_as_the_trainer_does(monkeypatch):
    """Whatever the trainer picks (the fused kernel on CUDA; here a stand-in choice the
    CPU accepts), the bare loop picks the same, with the same learning rate and decay."""
    import copy

    import torch

    monkeypatch.syspath_prepend(str(BENCH.parent))
    from bench_trainer_throughput import BareLoop, volume

    from napari_finetune.config import FinetuneConfig
    from napari_finetune.model.unet import UNet
    from napari_finetune.trainer import build
    from napari_finetune.trainer.loop import Finetuner

    asked = []

    def implementation(device, params):
        asked.append(device.type)
        return {"foreach": False}

    monkeypatch.setattr(build, "adamw_implementation", implementation)
    image, corrections = volume((24, 48, 48))
    start = UNet(dims=3, depth=2, features=4, norm="group")
    config = FinetuneConfig(steps=1, batch_size=2, patch_shape=(8, 16, 16), weight_decay=0.05,
                            learning_rate=3e-4, device="cpu", distillation=0.0,
                            hold_other_channels=False)
    trainer = Finetuner(copy.deepcopy(start), image, corrections, config)
    trainer.build()
    bare = BareLoop(copy.deepcopy(start), image, corrections, config, False, torch.device("cpu"))
    assert asked == ["cpu", "cpu"]
    ours, theirs = trainer.optimizer, bare.opt
    assert type(theirs) is type(ours) is torch.optim.AdamW
    assert theirs.defaults == ours.defaults
    assert theirs.defaults["foreach"] is False and theirs.defaults["weight_decay"] == 0.05
    assert [len(g["params"]) for g in theirs.param_groups] == [
        len(g["params"]) for g in ours.param_groups]


def test_the_matrix_part_runs_first_and_reports_a_lying_fake(bench, monkeypatch, capsys):
    """The matrix runs before any part (CUDA not started yet); a wrong row fails the part."""
    from napari_finetune.testing import cuda_matrix

    order = []
    real = cuda_matrix.run_matrix

    def run_matrix(cuda):
        order.append("matrix")
        return real(cuda)

    monkeypatch.setattr(cuda_matrix, "run_matrix", run_matrix)
    monkeypatch.setattr(bench, "make_data", lambda shape: (None, None))
    monkeypatch.setattr(bench, "prediction_speed", lambda *a: order.append("predict"))
    assert bench.main(["--cpu-dry-run", "--parts", "predict", "matrix"]) == 0
    assert order == ["matrix", "predict"]
    out = capsys.readouterr().out
    assert "| matrix | done |" in out and " NO |" not in out

    def lying(cuda):
        rows = real(cuda)
        return [rows[0].__class__(r.function, r.argument, r.expected, "lie", False)
                if i == 0 else r for i, r in enumerate(rows)]

    monkeypatch.setattr(cuda_matrix, "run_matrix", lying)
    assert bench.cuda_matrix(dry_run=True) is False
    assert " NO |" in capsys.readouterr().out


def test_the_syncs_part_counts_one_read_per_bf16_step(bench, capsys):
    image, corrections = bench.make_data((16, 64, 64))
    # 16x32x32: at 8x16x16 the sample UNet's bottleneck is 2x4x4, where CPU bf16 gave
    # non-finite gradients in this process (the probe then trains in fp32: nothing to count).
    assert bench.host_syncs(image, corrections, "cpu", (16, 32, 32), dry_run=True) is True
    rows = [line for line in capsys.readouterr().out.splitlines() if "| bfloat16 |" in line]
    assert rows and all(line.rstrip().endswith("| 1 |") for line in rows)
