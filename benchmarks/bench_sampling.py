"""Sample feeding: per-step sampling cost and how long training waits for it.

On the sample OME-Zarr store (image read lazily through dask) and on an
in-memory numpy copy of it, with the same painted corrections:

1. ``PatchSampler.sample(n)`` per step, from the store, from the store with
   the reachable region cached in memory (``sample_cache_gib``), and from memory;
2. Finetuner ms/step with ``prefetch_steps`` 0 (samples drawn on the training
   thread) and 2 (drawn in the background), and the share of step time the
   training thread spent waiting for samples (``trainer.feed.wait_s``).

Configurations are run round-robin (A/B interleaved) so machine load hits all
alike; the first round is warm-up. Prints Markdown tables.

    python benchmarks/bench_sampling.py [--rounds 4] [--steps 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from napari_finetune.config import FinetuneConfig
from napari_finetune.data.normalization import intensity_range
from napari_finetune.data.sampling import PatchSampler
from napari_finetune.io.volume import open_volume
from napari_finetune.loading import load_checkpoint
from napari_finetune.samples.store import ensure_sample
from napari_finetune.samples.synthetic_em import sample_checkpoint_path
from napari_finetune.trainer.loop import Finetuner

PATCH = (32, 64, 64)


def corrections_for(shape: tuple[int, ...]) -> np.ndarray:
    """A few background and foreground strokes spread over the volume."""
    rng = np.random.default_rng(0)
    corrections = np.zeros(shape, np.uint8)
    for label in (1, 2, 3) * 4:
        c = [int(rng.integers(4, s - 4)) for s in shape]
        corrections[c[0] - 2 : c[0] + 2, c[1] - 6 : c[1] + 6, c[2] - 6 : c[2] + 6] = label
    return corrections


def sampling_ms(image, corrections, low_high, n: int, draws: int, cache_gib: float) -> float:
    """Median ms of ``sample(n)``; the first draw (which fills the cache) is left out."""
    sampler = PatchSampler(image, corrections, PATCH, low_high, seed=0,
                           cache_bytes=int(cache_gib * 2**30))
    sampler.sample(n)
    times = []
    for _ in range(draws):
        t = time.perf_counter()
        sampler.sample(n)
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def finetuner_run(
    image, corrections, prefetch: int, steps: int, batch: int, cache_gib: float
) -> tuple[float, float]:
    """(median ms per step, share of the run's step time spent waiting for samples)."""
    ckpt = load_checkpoint(sample_checkpoint_path())
    config = FinetuneConfig(steps=steps, batch_size=batch, patch_shape=PATCH, device="cpu",
                            mixed_precision=False, prefetch_steps=prefetch, seed=0,
                            sample_cache_gib=cache_gib)
    trainer = Finetuner(ckpt.model, image, corrections, config, metadata=ckpt.metadata)
    times, last = [], None
    for status in trainer.run():
        if status.kind == "step":
            now = time.perf_counter()
            if last is not None:
                times.append(now - last)
            last = now
        elif status.kind == "probe":
            last = time.perf_counter()
    total = status.elapsed_s
    return 1000 * statistics.median(times), trainer.feed.wait_s / max(total, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(2)
    store_image = open_volume(ensure_sample("target")).data
    memory_image = np.asarray(store_image)
    corrections = corrections_for(memory_image.shape)
    low_high = intensity_range(memory_image, {"method": "percentile", "low": 1, "high": 99})
    print(f"load average at start: {os.getloadavg()}; volume {memory_image.shape}")

    sources = {
        "store": (store_image, 0.0),
        "store + cache": (store_image, 1.0),
        "memory": (memory_image, 0.0),
    }
    sampling = {k: [] for k in sources}
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for name, (image, cache_gib) in sources.items():
            ms = sampling_ms(image, corrections, low_high, args.batch, 20, cache_gib)
            if r:
                sampling[name].append(ms)
        for prefetch in (0, 2):
            for name, (image, cache_gib) in sources.items():
                result = finetuner_run(
                    image, corrections, prefetch, args.steps, args.batch, cache_gib
                )
                if r:
                    runs.setdefault((name, prefetch), []).append(result)
    print(f"load average at end: {os.getloadavg()}")
    print(f"\n| source | sample({args.batch}) at {PATCH} ms |\n|---|---:|")
    for name, values in sampling.items():
        print(f"| {name} | {statistics.median(values):.1f} |")
    print("\n| source | prefetch_steps | Finetuner ms/step | waiting for samples |")
    print("|---|---:|---:|---:|")
    for (name, prefetch), values in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ms = statistics.median(v[0] for v in values)
        wait = statistics.median(v[1] for v in values)
        print(f"| {name} | {prefetch} | {ms:.1f} | {100 * wait:.1f} % |")


if __name__ == "__main__":
    main()
