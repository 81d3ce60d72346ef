"""One process vs two ranks (gloo, CPU): training throughput per sample.

Each configuration trains the same UNet on the same volume for ``--steps``
optimizer steps of ``--samples`` samples per rank; the first ``--warmup``
steps are not timed. Two ranks run as two real processes with the
environment torchrun gives them, and train ``2 × --samples`` samples a step
(each rank its own patches, gradients summed once the ranks agreed). The
table gives the median step time, samples per second over all ranks, and the
speed-up per sample against one process with one thread.

    python benchmarks/bench_ddp.py [--steps 12] [--samples 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from napari_finetune.config import FinetuneConfig
from napari_finetune.model.unet import UNet
from napari_finetune.trainer.loop import Finetuner

sys.path.insert(0, str(Path(__file__).parent))
from markdown_table import print_table  # noqa: E402

PATCH = (16, 32, 32)


def volume(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A noisy 32x96x96 volume with blobs painted as channel 0, background around."""
    rng = np.random.default_rng(seed)
    image = rng.normal(100, 10, size=(32, 96, 96)).astype(np.float32)
    corrections = np.zeros(image.shape, np.uint8)
    for _ in range(16):
        z, y, x = (int(rng.integers(6, s - 6)) for s in image.shape)
        image[z - 3 : z + 3, y - 4 : y + 4, x - 4 : x + 4] += 50
        corrections[z - 3 : z + 3, y - 4 : y + 4, x - 4 : x + 4] = 2
        corrections[z, y - 8 : y - 6, x - 8 : x - 6] = 1
    return image, corrections


def worker(out: Path, steps: int, samples: int, warmup: int, threads: int) -> None:
    """Train one process (a rank when WORLD_SIZE > 1); write its step times."""
    torch.set_num_threads(threads)
    sync = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from napari_finetune.trainer import distributed

        sync = distributed.start("cpu", timeout_s=300)
    torch.manual_seed(0)
    model = UNet(dims=3, in_channels=1, out_channels=2, depth=2, features=8, norm="group")
    image, corrections = volume()
    config = FinetuneConfig(
        steps=steps, batch_size=samples, patch_shape=PATCH, mode="full", device="cpu",
        distillation=0.5, hold_other_channels=True, validation_fraction=0.0, seed=0,
    )
    trainer = Finetuner(model, image, corrections, config, sync=sync)
    times = []
    last = None
    for status in trainer.run():
        if status.kind == "step":
            if last is not None and status.step > warmup:
                times.append(status.elapsed_s - last)
            last = status.elapsed_s
    rank = 0 if sync is None else sync.rank
    (out / f"rank-{rank}.json").write_text(json.dumps(times))
    if sync is not None:
        from napari_finetune.trainer import distributed

        distributed.stop()


def measure(ranks: int, threads: int, args: argparse.Namespace) -> list[float]:
    """Median step time of ``ranks`` processes with ``threads`` threads each."""
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        procs = []
        for rank in range(ranks):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(threads)}
            command = [sys.executable, __file__, "--worker", tmp, "--steps", str(args.steps),
                       "--samples", str(args.samples), "--warmup", str(args.warmup),
                       "--threads", str(threads)]
            procs.append(subprocess.Popen(command, env=env))
        for proc in procs:
            if proc.wait(timeout=1800) != 0:
                raise SystemExit(f"a rank failed (exit code {proc.returncode})")
        times = json.loads((Path(tmp) / "rank-0.json").read_text())
    return times


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--samples", type=int, default=2, help="samples per step of one rank")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.steps, args.samples, args.warmup, args.threads)
        return
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"{os.cpu_count()} cores; patch {PATCH}, {args.samples} samples per rank and step, "
          f"{args.steps} steps ({args.warmup} warm-up)\n")
    rows = []
    base = None
    for ranks, threads in ((1, 1), (1, 2), (2, 1)):
        times = measure(ranks, threads, args)
        step = statistics.median(times)
        per_second = ranks * args.samples / step
        base = base or per_second
        rows.append([f"{ranks} × {threads} thread{'s' if threads > 1 else ''}",
                     str(ranks * args.samples), f"{step:.2f}", f"{per_second:.2f}",
                     f"{per_second / base:.2f}×"])
    print_table(["processes × threads", "samples/step", "median step (s)", "samples/s",
                 "per-sample speed-up"], rows)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
