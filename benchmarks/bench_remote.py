"""A fine-tune on a dask worker against the same run in process (issue 44).

On the sample store (target domain) with strokes spread over it, the sample
model, CPU, fp32: the in-process run and the same run on a LocalCluster of one
worker process (one task thread; torch on the CPUs of the process in both, as
the training task sets it on the worker), after a one-step warm-up of each. Reports wall time of
the run (remote: connect, checks, reading and shipping the tiles, the run, the
weights back), the overhead, the status latency worker -> client (p50, p95;
one machine, one clock), and the bytes shipped against the volume's size.
Budgets are optimizer steps, so results do not depend on load.

Beside it, the bytes a run would send (the checkpoint, the painting, the image
tiles its patches can reach; counted, not sent or timed) with the same strokes
spread over the volume and moved into one region; ``--bytes-only`` prints just
that table (no cluster).

``--kill-at N`` instead SIGKILLs the worker process at step N of a long run and
reports how long until the client knew, the step of the last weights it
received (sent every 5 steps), and a second run that continues from them.

    python benchmarks/bench_remote.py [--steps 20] [--rounds 2] [--kill-at N] [--bytes-only]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_sampling import PATCH, corrections_for
from markdown_table import measured_under, print_table

from napari_finetune.config import FinetuneConfig
from napari_finetune.io.volume import open_volume
from napari_finetune.loading import load_checkpoint
from napari_finetune.remote.finetuner import RemoteFinetuner, RemoteWorkerLost
from napari_finetune.remote.process import usable_cpus
from napari_finetune.samples.store import ensure_sample
from napari_finetune.samples.synthetic_em import sample_checkpoint_path
from napari_finetune.trainer.loop import Finetuner


def config(steps: int) -> FinetuneConfig:
    return FinetuneConfig(steps=steps, batch_size=2, patch_shape=PATCH, device="cpu",
                          mixed_precision=False, seed=0, validation_fraction=0.0)


def in_process(image, corrections, steps: int) -> tuple[float, list[float]]:
    ckpt = load_checkpoint(sample_checkpoint_path())
    began = time.perf_counter()
    trainer = Finetuner.from_checkpoint(ckpt, image, corrections, config(steps))
    losses = [s.loss for s in trainer.run() if s.kind == "step"]
    return time.perf_counter() - began, losses


def remote(client, image, corrections, steps: int) -> tuple[float, list[float], RemoteFinetuner]:
    ckpt = load_checkpoint(sample_checkpoint_path())
    began = time.perf_counter()
    trainer = RemoteFinetuner.remote(ckpt, image, corrections, config(steps), client)
    losses = [s.loss for s in trainer.run() if s.kind == "step"]
    return time.perf_counter() - began, losses, trainer


def in_one_region(corrections: np.ndarray) -> np.ndarray:
    """As many painted voxels of each label as ``corrections`` has, packed into one
    region of the volume (a corner box one patch wide), label after label."""
    shape = corrections.shape
    box = tuple(slice(0, min(p, s)) for p, s in zip(PATCH, shape, strict=True))
    painted = corrections[corrections > 0]
    packed = np.zeros(shape, corrections.dtype)
    region = packed[box].reshape(-1)
    if painted.size > region.size:
        raise ValueError(f"{painted.size} painted voxels do not fit in one patch {PATCH}")
    region[: painted.size] = np.sort(painted)
    packed[box] = region.reshape(packed[box].shape)
    return packed


def bytes_by_spread(image, corrections) -> None:
    """What a run would send with the strokes spread over the volume vs in one region."""
    ckpt = load_checkpoint(sample_checkpoint_path())
    rows = []
    for where, painting in (("spread over the volume", corrections),
                            ("in one region", in_one_region(corrections))):
        trainer = RemoteFinetuner.remote(ckpt, image, painting, config(1), "tcp://127.0.0.1:9")
        parts = trainer.planned_bytes()
        volume = int(np.prod(image.shape)) * np.dtype(image.dtype).itemsize
        rows.append([where, str(int(np.count_nonzero(painting))),
                     f"{parts['image'] / 1e6:.2f}",
                     f"{(parts['checkpoint'] + parts['painting']) / 1e6:.2f}",
                     f"{sum(parts.values()) / 1e6:.2f} / {volume / 1e6:.1f}"])
    print_table(["strokes", "painted voxels", "image tiles MB", "checkpoint + painting MB",
                 "MB sent / volume MB"], rows)


def kill_at(client, image, corrections, step: int) -> None:
    """SIGKILL the worker at ``step``; what the client knew when, and a run from the rest."""
    [pid] = client.run(os.getpid).values()
    ckpt = load_checkpoint(sample_checkpoint_path())
    trainer = RemoteFinetuner.remote(ckpt, image, corrections, config(step + 100), client)
    losses: dict[int, float] = {}
    killed, known = 0.0, float("nan")
    try:
        for status in trainer.run():
            if status.kind == "step":
                losses[status.step] = status.loss
                if status.step == step:
                    os.kill(pid, signal.SIGKILL)
                    killed = time.perf_counter()
    except RemoteWorkerLost:
        known = time.perf_counter() - killed
    kept_step = trainer.steps_done
    with tempfile.TemporaryDirectory() as folder:
        kept = trainer.export(Path(folder) / "kept.pt")
        began = time.perf_counter()
        client.wait_for_workers(1, timeout=120)  # the nanny's new worker
        back = time.perf_counter() - began
        again = RemoteFinetuner.remote(load_checkpoint(kept), image, corrections, config(5),
                                       client)
        first = next(s.loss for s in again.run() if s.kind == "step")
        again_file = again.export(Path(folder) / "again.pt")
        previous = load_checkpoint(again_file).metadata["run"]["previous_run"]["steps_done"]
    print(measured_under())
    print_table(
        ["killed at step", "client knew after s", "last weights received (step)",
         "steps lost", "new worker after s", "second run continues from step",
         "loss at the kept step / first loss of the second run"],
        [[str(step), f"{known:.2f}", str(kept_step), str(step - kept_step), f"{back:.1f}",
          str(previous), f"{losses.get(kept_step, float('nan')):.3f} / {first:.3f}"]],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--bytes-only", action="store_true",
                        help="only the bytes sent, strokes spread vs in one region")
    args = parser.parse_args()
    if args.bytes_only:
        image = open_volume(ensure_sample()).data
        print(measured_under())
        bytes_by_spread(image, corrections_for(tuple(int(s) for s in image.shape)))
        return
    from distributed import Client, LocalCluster

    # What the training task gives torch on a worker of one task thread.
    torch.set_num_threads(usable_cpus())
    image = open_volume(ensure_sample()).data
    corrections = corrections_for(tuple(int(s) for s in image.shape))
    with LocalCluster(processes=True, n_workers=1, threads_per_worker=1,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        if args.kill_at:
            kill_at(client, image, corrections, args.kill_at)
            return
        in_process(image, corrections, 1)  # warm-up: imports, the first AdamW
        remote(client, image, corrections, 1)
        local_s, remote_s, latency = [], [], []
        for _ in range(args.rounds):  # interleaved, so load hits both alike
            t, local_losses = in_process(image, corrections, args.steps)
            local_s.append(t)
            t, losses, trainer = remote(client, image, corrections, args.steps)
            remote_s.append(t)
            latency += trainer.status_latency_s
            worst = float(np.max(np.abs(np.subtract(losses, local_losses))))
    print(measured_under())
    print(f"worker process: {trainer.worker_tuning}")
    lo, re = statistics.median(local_s), statistics.median(remote_s)
    p50, p95 = (1000 * float(np.percentile(latency, q)) for q in (50, 95))
    print_table(
        ["steps", "in process s", "remote s", "overhead", "status latency p50 / p95 ms",
         "MB sent / volume MB", "largest loss difference"],
        [[str(args.steps), f"{lo:.1f}", f"{re:.1f}", f"{100 * (re - lo) / lo:+.0f} %",
          f"{p50:.1f} / {p95:.1f}", f"{trainer.bytes_sent / 1e6:.2f} / "
          f"{trainer.volume_bytes / 1e6:.1f}", f"{worst:.1e}"]],
    )
    bytes_by_spread(image, corrections)


if __name__ == "__main__":
    main()
