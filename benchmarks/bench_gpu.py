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
4. **Autobatch against the real limit**: the allocator capped at about 12
   one-sample steps (``set_per_process_memory_fraction``), 64 samples per step:
   the micro-batch autobatch picks from its measured profile, the OOM events of
   that run, and the largest micro-batch that really trains a step under the
   same cap (bisection, one short run per size). Goal: the choice at or below the
   limit and no OOM event; near ``memory_fraction`` (0.8) of the limit, less the
   rounding of a balanced cut of the step (64 at most 17 -> 4 x 16).

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



def autobatch_vs_limit(image, corrections, device: str, patch, dry_run: bool) -> None:
    """Part 4: autobatch's choice and the largest micro-batch that fits, one cap."""
    import contextlib

    import torch

    from napari_finetune.config import FinetuneConfig
    from napari_finetune.trainer.loop import Finetuner
    from napari_finetune.trainer.recovery import RecoveryError

    samples = 64

    def cfg(batch, steps, autobatch):
        return FinetuneConfig(
            steps=steps, batch_size=batch, patch_shape=patch, device=device, seed=0,
            autobatch=autobatch, prefetch_steps=0,
        )

    def one_sample_peak() -> int:
        """Peak bytes of a 2-step run at batch 1, above what was resident before."""
        model, metadata = load_model()
        trainer = Finetuner(model, image, corrections, cfg(1, 2, False), metadata=metadata)
        trainer.build()
        if dry_run:
            from napari_finetune.testing import MemoryBudget

            with MemoryBudget(10**12) as budget:
                list(trainer.run())
            return budget.peak_bytes
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        list(trainer.run())
        return torch.cuda.max_memory_allocated() - base

    cap = 12 * one_sample_peak()

    @contextlib.contextmanager
    def capped():
        if dry_run:  # the CPU has no allocator cap: a MemoryBudget plays the GPU
            from napari_finetune.testing import MemoryBudget

            with MemoryBudget(cap) as budget:
                yield budget
            return
        gc.collect()
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, (torch.cuda.memory_allocated() + cap) / total)
        )
        try:
            yield None
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)

    def run(batch, steps, autobatch):
        model, metadata = load_model()
        trainer = Finetuner(model, image, corrections, cfg(batch, steps, autobatch),
                            metadata=metadata)
        trainer.build()  # the weights are resident before the cap, as in a real session
        with capped() as memory:
            trainer.memory_info = memory
            try:
                events = list(trainer.run())
            except RecoveryError:
                return trainer, None
        return trainer, events

    def ooms(events) -> int:
        return sum("out of memory" in e.message for e in events or [])

    trainer, events = run(samples, 3, True)
    decision = trainer.autobatch_decision
    chosen, chose_ooms = trainer.batch_size if decision else None, ooms(events)
    first = events[0].batch_size if events else None

    def fits(batch) -> bool:
        _, ev = run(batch, 1, False)
        return ev is not None and ooms(ev) == 0

    lo, hi = 1, samples + 1  # fits(lo); not known for hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    print(
        f"4. autobatch against the real limit: cap {cap / 2**20:.1f} MiB (12 one-sample steps), "
        f"{samples} samples per step, memory_fraction 0.8"
    )
    print(f"   {decision.message if decision else 'no decision'}")
    print_table(
        ["autobatch micro-batch", "largest micro-batch that trains", "choice / limit",
         "OOM events (autobatch run)", "steps done"],
        [[str(chosen), str(lo), f"{chosen / lo:.2f}" if chosen else "-", str(chose_ooms),
          f"{trainer.steps_done}/3"]],
    )
    ok = chosen is not None and chosen <= lo and chose_ooms == 0 and first == chosen
    print(f"   => {'PASS' if ok else 'FAIL'}: choice within the limit and no OOM event")


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
    autobatch_vs_limit(image, corrections, device, patch, args.cpu_dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
