"""Blockwise prediction: speed against one model call, agreement, and peak memory.

Prints two tables:

1. throughput on one volume: a single model call on the whole volume (the
   reference) against ``predict_volume`` with several block/halo settings:
   voxels/s, ratio to the single call (goal >= 0.9), voxels the model
   computed per output voxel (the halo's cost), largest probability
   difference and the share of voxels whose decision (p > 0.5) differs (the
   UNet uses GroupNorm, so blocks are not bit-identical to one call);
2. peak resident memory against volume size, each case in a fresh process
   reading a zarr array from disk and writing a zarr array: blockwise stays
   flat, a single call grows with the volume;
3. the prediction of an OME-Zarr store on dask.distributed, 1 against 2 local
   worker processes of one thread each: voxels/s, speedup, peak memory per
   worker, and what the measured per-worker rate means for 1 Tvoxel on 100
   workers (``predict_cluster_rows.py``; ``--distributed`` runs only this).

Usage::

    python benchmarks/bench_predict.py            # ~5 min on 2 CPU cores
    python benchmarks/bench_predict.py --quick    # ~1 min
    python benchmarks/bench_predict.py --distributed   # table 3 only, ~2 min
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from markdown_table import print_table

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

BLOCK_SETTINGS = [  # (label, block_shape, halo)
    ("no halo (machinery only)", (32, 128, 128), (0, 0, 0)),
    ("default", None, None),
    ("big blocks", (64, 128, 128), (8, 16, 16)),
    ("wide blocks", (32, 256, 256), (8, 16, 16)),
    ("large halo", (32, 128, 128), (16, 32, 32)),
]


def load_model(checkpoint: str | None):
    """The sample checkpoint when present (real weights, GroupNorm), else a fresh UNet."""
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.model.unet import UNet

    path = checkpoint
    if path is None:
        try:
            from napari_finetune.samples.synthetic_em import sample_checkpoint_path

            path = str(sample_checkpoint_path()) if sample_checkpoint_path().is_file() else None
        except ImportError:
            path = None
    if path is None:
        return UNet().eval(), "UNet() random weights"
    return load_checkpoint(path).model, Path(path).name


def volume(shape: tuple[int, ...]) -> np.ndarray:
    """The synthetic EM target volume (real structure, so block statistics matter)."""
    from napari_finetune.samples.synthetic_em import generate_volume

    return generate_volume(shape, domain="target")[0]


def throughput(model, shape: tuple[int, ...], repeats: int) -> list[list[str]]:
    """Table 1 rows."""
    from napari_finetune.config import PredictConfig
    from napari_finetune.data.normalization import intensity_range, normalize
    from napari_finetune.model.geometry import shape_multiple
    from napari_finetune.predict import block_grid, predict_block, predict_volume

    image = volume(shape)
    low, high = intensity_range(image, {"method": "percentile", "low": 1, "high": 99})
    voxels = int(np.prod(shape))

    def best_of(fn):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - t)
        return min(times), result

    t_ref, reference = best_of(lambda: predict_block(model, normalize(image, low, high)))
    rows = [
        [
            "one call (reference)",
            "-",
            "-",
            f"{t_ref:.1f}",
            f"{voxels / t_ref / 1e6:.3f}",
            "1.00",
            "1.00",
            "0",
            "0",
        ]
    ]
    for label, block, halo in BLOCK_SETTINGS:
        config = (
            PredictConfig(device="cpu")
            if block is None
            else PredictConfig(block_shape=block, halo=halo, device="cpu")
        )
        t, result = best_of(lambda c=config: predict_volume(model, image, (low, high), c))
        grid = block_grid(shape, config.block_shape, config.halo, shape_multiple(model))
        computed = sum(int(np.prod([r.stop - r.start for r in read])) for _, read, _ in grid)
        diff = float(np.abs(result - reference).max())
        flips = float(((result > 0.5) != (reference > 0.5)).mean())
        rows.append(
            [
                label,
                "x".join(map(str, config.block_shape)),
                "x".join(map(str, config.halo)),
                f"{t:.1f}",
                f"{voxels / t / 1e6:.3f}",
                f"{t_ref / t:.2f}",
                f"{computed / voxels:.2f}",
                f"{diff:.3f}",
                f"{100 * flips:.3f}%",
            ]
        )
    return rows


def memory_child(mode: str, store: str, out: str, checkpoint: str | None) -> None:
    """Run one case and print JSON: baseline and peak RSS in MiB (Linux /proc)."""
    import zarr

    from napari_finetune.config import PredictConfig
    from napari_finetune.predict import predict_block, predict_volume

    model, _ = load_model(checkpoint)
    image = zarr.open_array(store, mode="r")
    predict_block(model, np.zeros((16, 32, 32), np.float32))  # warm the runtime up
    base = _rss("VmRSS")
    t = time.perf_counter()
    if mode == "blockwise":
        target = zarr.create_array(
            store=out, shape=(2, *image.shape), chunks=(1, 32, 128, 128), dtype="f4", overwrite=True
        )
        predict_volume(model, image, (0.0, 255.0), PredictConfig(device="cpu"), out=target)
    else:
        target = zarr.create_array(
            store=out, shape=(2, *image.shape), chunks=(1, 32, 128, 128), dtype="f4", overwrite=True
        )
        target[:] = predict_block(model, np.asarray(image[:], np.float32) / 255.0)
    print(json.dumps({"base": base, "peak": _rss("VmHWM"), "seconds": time.perf_counter() - t}))


def _rss(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def memory(shapes: list[tuple[int, ...]], one_call_max: int, checkpoint: str | None):
    """Table 2 rows: one fresh process per (mode, shape)."""
    import zarr

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            store = os.path.join(tmp, "in.zarr")
            arr = zarr.create_array(
                store=store, shape=shape, chunks=(32, 128, 128), dtype="u1", overwrite=True
            )
            rng = np.random.default_rng(0)
            for z in range(0, shape[0], 32):  # written chunk by chunk: the parent stays small
                arr[z : z + 32] = rng.integers(
                    0, 255, (min(32, shape[0] - z), *shape[1:]), dtype=np.uint8
                )
            modes = ["blockwise"] + (["one call"] if np.prod(shape) <= one_call_max else [])
            for mode in modes:
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    mode,
                    store,
                    os.path.join(tmp, "out.zarr"),
                ]
                if checkpoint:
                    cmd += ["--checkpoint", checkpoint]
                res = json.loads(
                    subprocess.run(cmd, capture_output=True, text=True, check=True)
                    .stdout.strip()
                    .splitlines()[-1]
                )
                mvox = np.prod(shape) / 1e6
                rows.append(
                    [
                        mode,
                        "x".join(map(str, shape)),
                        f"{mvox:.1f}",
                        f"{res['peak'] - res['base']:.0f}",
                        f"{res['peak']:.0f}",
                        f"{res['seconds']:.1f}",
                    ]
                )
    return rows



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller volumes")
    parser.add_argument("--checkpoint", help="model to use (default: the sample checkpoint)")
    parser.add_argument("--repeats", type=int, default=1, help="timings per setting (best)")
    parser.add_argument("--distributed", action="store_true", help="only table 3")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        memory_child(*args.child, args.checkpoint)
        return
    import torch

    model, model_name = load_model(args.checkpoint)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; model: {model_name}\n"
    )
    if not args.distributed:
        tables_1_and_2(model, args)
    cluster_table(args)


def cluster_table(args: argparse.Namespace) -> None:
    """Table 3: 1 against 2 local dask workers, one thread each."""
    from predict_cluster_rows import rows

    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    checkpoint = args.checkpoint or str(sample_checkpoint_path())
    shapes = [(64, 256, 256)] if args.quick else [(64, 256, 256), (128, 256, 256)]
    load = os.getloadavg()
    print(f"dask.distributed LocalCluster, 1 task thread + 1 torch thread per worker; "
          f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    table, line = rows(checkpoint, shapes, volume)
    print_table(["workers", "volume", "regions", "s", "Mvox/s", "speedup", "CPU s per worker",
                 "Mvox per CPU s", "peak MiB per worker (+ over warm)"], table)
    print(line)
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def tables_1_and_2(model, args: argparse.Namespace) -> None:
    """Tables 1 and 2 (in process)."""
    shape = (40, 192, 192) if args.quick else (64, 256, 256)
    print(f"Blockwise against one call, volume {shape}, best of {args.repeats}")
    print_table(
        ["setting", "block", "halo", "s", "Mvox/s", "ratio", "read/out", "max |dp|", "flips"],
        throughput(model, shape, args.repeats),
    )
    shapes = (
        [(32, 128, 128), (64, 128, 128)]
        if args.quick
        else [(32, 128, 128), (64, 256, 256), (128, 256, 256), (256, 512, 512)]
    )
    print("Peak memory (RSS) against volume size, zarr in -> zarr out, default PredictConfig")
    print_table(
        ["mode", "volume", "Mvoxels", "extra MiB", "peak MiB", "s"],
        memory(shapes, 10_000_000, args.checkpoint),
    )


if __name__ == "__main__":
    main()
