"""Table 3 of bench_predict.py: the prediction on dask.distributed, 1 against 2 local workers.

Each case starts a LocalCluster of N worker processes with one task thread and
one torch thread each, warms every worker up (imports, model load) on a small
store, then predicts an OME-Zarr store of the synthetic EM volume with
``predict_on_cluster`` (default PredictConfig, so each region is one
64x128x128 output chunk plus halo). Reported: wall time of the whole job
(regions, then the client's pyramid and swap), voxels/s, the speedup over one
worker, and each worker process's peak resident memory (``VmHWM``) with,
in brackets, how much it grew over the warmed-up worker (imports, model). The
CPU seconds each worker process spent on the job, and voxels per CPU second
(a rate the machine's load does not change: on a shared machine, wall time
does), tell whether two workers do the same work as one.
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

import numpy as np


def write_store(path: Path, image: np.ndarray) -> Path:
    """``image`` as a single-level NGFF 0.5 store (ome-zarr-py), chunked as the blocks."""
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    group = zarr.group(store=parse_url(str(path), mode="w").store)
    write_image(image, group, axes="zyx", scaler=None,
                storage_options={"chunks": (64, 128, 128)})
    return path


def _peak_rss_mib() -> float:
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a worker spawned by a
    # big parent would report the parent's peak.
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_case(checkpoint: str, workers: int, stores: list[Path], warm: Path) -> list[dict]:
    """Time ``predict_on_cluster`` on each store with ``workers`` one-thread workers."""
    from distributed import Client

    from napari_finetune.config import PredictConfig
    from napari_finetune.predict.distributed import local_cluster, predict_on_cluster

    config = PredictConfig(device="cpu")
    cluster, _ = local_cluster(workers, dashboard_address=":0")
    results = []
    try:
        with Client(cluster) as client:
            # Small blocks: every worker gets a region, so each has loaded the model.
            warm_config = PredictConfig(block_shape=(16, 32, 32), device="cpu")
            predict_on_cluster(checkpoint, warm, client, "warm", warm_config, torch_threads=1)
            # Imports, model and tiny blocks: what a worker holds before any real region.
            base = client.run(_peak_rss_mib)
            for store in stores:
                cpu = client.run(_cpu_seconds)
                t = time.perf_counter()
                run = predict_on_cluster(checkpoint, store, client, f"w{workers}", config,
                                         torch_threads=1)
                seconds = time.perf_counter() - t
                peaks = client.run(_peak_rss_mib)
                cpu = {w: c - cpu[w] for w, c in client.run(_cpu_seconds).items()}
                results.append({"store": store, "seconds": seconds, "regions": run.total,
                                "cpu": [cpu[w] for w in sorted(cpu)],
                                "peaks": [(peaks[w], peaks[w] - base[w]) for w in sorted(peaks)]})
    finally:
        cluster.close()
    return results


def rows(checkpoint: str, shapes: list[tuple[int, int, int]], volume) -> tuple[list, str]:
    """Table rows (1 then 2 workers, each volume) and the 1-Tvoxel arithmetic line."""
    out, rate, cpu_rate = [], {}, []
    with tempfile.TemporaryDirectory() as tmp:
        stores = [write_store(Path(tmp) / f"v{i}.zarr", volume(s)) for i, s in enumerate(shapes)]
        warm = write_store(Path(tmp) / "warm.zarr", volume((16, 64, 64)))
        for workers in (1, 2):
            for shape, res in zip(shapes, one_case(checkpoint, workers, stores, warm),
                                  strict=True):
                voxels = int(np.prod(shape))
                rate[(workers, shape)] = voxels / res["seconds"]
                cpu_rate.append(voxels / sum(res["cpu"]))
                speedup = rate[(workers, shape)] / rate.get((1, shape), rate[(workers, shape)])
                out.append([
                    str(workers), "x".join(map(str, shape)), str(res["regions"]),
                    f"{res['seconds']:.1f}", f"{voxels / res['seconds'] / 1e6:.3f}",
                    f"{speedup:.2f}",
                    " / ".join(f"{c:.1f}" for c in res["cpu"]),
                    f"{voxels / sum(res['cpu']) / 1e6:.3f}",
                    " / ".join(f"{p:.0f} (+{extra:.0f})" for p, extra in res["peaks"]),
                ])
    # A worker's rate: alone, or half of two (whichever the machine's load let be higher).
    per_worker = max(max(rate[(1, s)], rate[(2, s)] / 2) for s in shapes)
    hours = 1e12 / (100 * per_worker) / 3600
    # On a core of its own a worker runs at its voxels per CPU second (the median case).
    dedicated = sorted(cpu_rate)[len(cpu_rate) // 2]
    line = (
        f"1 Tvoxel on 100 such workers: 1e12 / (100 x {per_worker / 1e6:.3f} Mvoxel/s per "
        f"worker, wall clock here) = {hours:.1f} h ({hours / 24:.2f} days); with a core each "
        f"(1e12 / (100 x {dedicated / 1e6:.3f} Mvoxel per CPU second)) = "
        f"{1e12 / (100 * dedicated) / 3600:.1f} h; if the store's file system keeps up and "
        "the work is spread evenly"
    )
    return out, line
