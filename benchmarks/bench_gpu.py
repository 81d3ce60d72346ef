"""GPU benchmark: bf16 against fp32, a real out-of-memory recovery, memory after the run.

Run it when a CUDA GPU is lent (about 3 minutes on an H100/H200)::

    python benchmarks/bench_gpu.py
    python benchmarks/bench_gpu.py --cpu-dry-run   # same code paths on the CPU, tiny sizes,
                                                   # OOM injected (checks the script itself)

1. **Step speed**: the same fine-tuning run (sample UNet, batch 8 x 32x64x64
   patches, LoRA) with mixed precision on (bf16 where the GPU has it) and off
   (fp32): seconds per optimizer step after warm-up, samples/s, speed-up.
2. **Real OOM recovery**: ``torch.cuda.set_per_process_memory_fraction`` caps
   the allocator so that the starting batch does not fit; the Finetuner must
   halve the batch (accumulation doubled, samples per step unchanged) and
   finish every step. Prints the recovery lines and the final state.
3. **Memory back to baseline**: allocated/reserved CUDA memory before the
   trainer is built and after it is deleted (gc + empty_cache).

Exits with code 2 and one line when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import numpy as np
from markdown_table import print_table


def make_data(shape: tuple[int, int, int]):
    """Target-domain sample volume and dense-ish corrections on two slices."""
    from napari_finetune.samples.synthetic_em import generate_volume

    image, truth = generate_volume(shape, domain="target")
    corrections = np.zeros(shape, np.uint8)
    for z in (shape[0] // 4, shape[0] // 2):
        corrections[z] = truth[z] + 1
    return image, corrections


def load_model():
    """The sample checkpoint when present, else the same architecture untrained."""
    from napari_finetune.model.checkpoint import load_checkpoint
    from napari_finetune.model.unet import UNet
    from napari_finetune.samples.synthetic_em import sample_checkpoint_path

    path = sample_checkpoint_path()
    if path.is_file():
        ckpt = load_checkpoint(path)
        return ckpt.model, ckpt.metadata
    return UNet(dims=3, depth=3, features=8), {}


def timed_run(image, corrections, config, after_build=None):
    """Run a Finetuner; return (seconds per step after the first 2 steps, statuses)."""
    from napari_finetune.trainer.loop import Finetuner

    model, metadata = load_model()
    trainer = Finetuner(model, image, corrections, config, metadata=metadata)
    if after_build is not None:
        trainer.after_build.append(after_build)
    statuses, stamps = [], []
    for status in trainer.run():
        statuses.append(status)
        if status.kind == "step":
            _sync(config.device)
            stamps.append(time.perf_counter())
    per_step = (stamps[-1] - stamps[1]) / (len(stamps) - 2) if len(stamps) > 2 else float("nan")
    del trainer, model
    return per_step, statuses


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def speed(image, corrections, device: str, steps: int, batch: int, patch) -> None:
    """Part 1 table."""
    from napari_finetune.config import FinetuneConfig

    rows = []
    for mixed in (False, True):
        config = FinetuneConfig(
            steps=steps,
            batch_size=batch,
            patch_shape=patch,
            device=device,
            mixed_precision=mixed,
            cpu_bf16=mixed,
            seed=0,
        )
        per_step, statuses = timed_run(image, corrections, config)
        last = statuses[-1]
        rows.append(
            [
                f"{'mixed' if mixed else 'fp32'}",
                last.dtype,
                str(last.grad_scaler),
                f"{last.batch_size}x{last.accumulation}",
                f"{per_step:.3f}",
                f"{batch / per_step:.1f}",
            ]
        )
    rows[1].append(f"{float(rows[0][4]) / float(rows[1][4]):.2f}x")
    rows[0].append("1.00x")
    print(f"1. step speed, batch {batch} x {'x'.join(map(str, patch))}, {steps} steps")
    header = ["run", "dtype", "GradScaler", "batch x acc", "s/step", "samples/s", "speed-up"]
    print_table(header, rows)


def oom_recovery(image, corrections, device: str, batch: int, patch, dry_run: bool) -> None:
    """Parts 2 and 3: a capped allocator, the ladder, memory after the run."""
    import torch

    from napari_finetune.config import FinetuneConfig

    config = FinetuneConfig(steps=4, batch_size=batch, patch_shape=patch, device=device, seed=0)
    before = _memory(device)
    hook = None
    if dry_run:
        from napari_finetune.testing import oom_above_batch

        def hook(trainer):  # noqa: ANN001 - the CPU has no allocator cap: inject instead
            oom_above_batch(trainer.model, max(1, batch // 4))
    else:
        # Measure one sample's step, then cap the allocator at ~3 samples' worth.
        one = FinetuneConfig(steps=2, batch_size=1, patch_shape=patch, device=device, seed=0)
        torch.cuda.reset_peak_memory_stats()
        timed_run(image, corrections, one)
        per_sample = torch.cuda.max_memory_allocated()
        gc.collect()
        torch.cuda.empty_cache()  # the cap counts cached blocks too
        total = torch.cuda.get_device_properties(0).total_memory
        fraction = min(0.9, 3.0 * per_sample / total)
        torch.cuda.set_per_process_memory_fraction(fraction)
        print(
            f"2. allocator capped at {fraction * total / 2**20:.0f} MiB "
            f"(one-sample step peak {per_sample / 2**20:.0f} MiB); starting batch {batch}"
        )
    t = time.perf_counter()
    _, statuses = timed_run(image, corrections, config, after_build=hook)
    elapsed = time.perf_counter() - t
    for status in statuses:
        if status.kind in ("recovery", "probe", "finished"):
            print(
                f"   [{status.kind} {status.step}/{status.total_steps}] {status.dtype} "
                f"batch {status.batch_size} x {status.accumulation}  {status.message}"
            )
    last = statuses[-1]
    ok = last.kind == "finished" and last.effective_batch == batch and last.batch_size < batch
    print(
        f"   => {'PASS' if ok else 'FAIL'}: {last.step}/{last.total_steps} steps, final batch "
        f"{last.batch_size} x {last.accumulation} (samples/step {last.effective_batch}), "
        f"{elapsed:.1f} s\n"
    )
    if not dry_run:
        torch.cuda.set_per_process_memory_fraction(1.0)
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    after = _memory(device)
    print("3. memory before the trainer was built and after it was deleted")
    print_table(
        ["", "allocated MiB", "reserved MiB"],
        [
            ["before", f"{before[0]:.1f}", f"{before[1]:.1f}"],
            ["after", f"{after[0]:.1f}", f"{after[1]:.1f}"],
        ],
    )
    back = after[0] <= before[0] + 1.0
    print(
        f"   => {'PASS' if back else 'FAIL'}: allocated memory back to baseline "
        f"(+{after[0] - before[0]:.1f} MiB)"
    )


def _memory(device: str) -> tuple[float, float]:
    import torch

    if not device.startswith("cuda"):
        return 0.0, 0.0
    return torch.cuda.memory_allocated() / 2**20, torch.cuda.memory_reserved() / 2**20



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="run every part on the CPU with tiny sizes (no timing value)",
    )
    parser.add_argument("--steps", type=int, default=12, help="steps per speed run")
    args = parser.parse_args(argv)
    import torch

    if args.cpu_dry_run:
        device, shape, batch, patch, steps = "cpu", (16, 64, 64), 4, (8, 32, 32), 4
    elif not torch.cuda.is_available():
        print(
            "bench_gpu.py: no CUDA device (torch.cuda.is_available() is False); nothing "
            "measured. Run it on a GPU machine, or use --cpu-dry-run to check the script.",
            file=sys.stderr,
        )
        return 2
    else:
        device, shape, batch, patch, steps = "cuda", (64, 256, 256), 8, (32, 64, 64), args.steps
        props = torch.cuda.get_device_properties(0)
        print(
            f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, capability "
            f"{props.major}.{props.minor}, torch {torch.__version__}, "
            f"bf16 supported: {torch.cuda.is_bf16_supported()}\n"
        )
    image, corrections = make_data(shape)
    speed(image, corrections, device, steps, batch, patch)
    oom_recovery(image, corrections, device, 2 * batch, patch, args.cpu_dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
