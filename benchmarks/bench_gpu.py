"""GPU benchmark: what a user's GPU run costs and survives, in one call of <= 5 minutes.

Run it when a CUDA GPU is lent (about 4 minutes on an H100/H200)::

    python benchmarks/bench_gpu.py
    python benchmarks/bench_gpu.py --cpu-dry-run   # same code paths on the CPU, tiny sizes,
                                                   # OOM injected (checks the script itself)

1. **Step speed**: the same fine-tuning run (sample UNet, batch 8 x 32x64x64
   patches, full fine-tune) with mixed precision on (bf16 where the GPU has it)
   and off (fp32, TF32 off: ``torch.backends.cuda.matmul.allow_tf32`` and
   ``torch.backends.cudnn.allow_tf32`` False for those rows, put back after, so
   they are true fp32 and not cuDNN's default TF32 convolutions): seconds per
   optimizer step after warm-up, samples/s, speed-up.
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

0. **The default run**: ``FinetuneConfig()`` as the widget builds it on
   ``device="cuda"`` (autobatch on, mixed precision on), a few steps: it must
   reach step 1 and finish (every default CUDA run once crashed before step 1).
   Prints autobatch's line and the precision probe's verdict: bf16 (or fp16)
   against an fp32 pass of the first batch, output and gradient cosines.
5. **Finetuner against a bare loop**: the same UNet (depth 3, 16 features), batch
   8 x 32x64x64, bf16, interleaved in one process (``bench_trainer_throughput``):
   validation off (goal >= 0.90) and at the defaults. The bare loop's AdamW is
   built as the trainer builds it (``fused`` on CUDA, the config's weight decay).
6. **Time to quality** on an appearance the sample model never saw
   (``bench_adaptation.unseen_appearance``): held-out IoU against wall-clock
   seconds of a full and a LoRA fine-tune at the widget's defaults on the demo's
   simulated painting, and the seconds to 90 % and 95 % of a dense bound (the
   same model trained on every voxel of the painted half for ``--dense-s``).
7. **Prediction speed**: ``predict_volume`` at the default block and at one
   large block against the model alone (one call on the whole volume) on a
   128x512x512 volume, Mvoxel/s (goal >= 0.80 of the model alone).

8. **The CUDA fake against torch** (``matrix``, run first, before anything starts
   CUDA): ``napari_finetune.testing.cuda_matrix.run_matrix(torch.cuda)``, the
   argument matrix the CPU tests run against ``FakeCuda``; a row that differs
   is a fake that lies (fix the fake and its matrix row). The dry run plays it
   against ``FakeCuda``.
9. **Host syncs per step** (``syncs``): a bf16 run of a few steps under
   ``torch.cuda.set_sync_debug_mode("warn")``, the synchronising calls counted
   per attempt at an optimizer step (goal: 1). The dry run counts the reads of
   device values with ``napari_finetune.testing.host_reads.HostReads``.

``--parts`` picks parts (default all). Each part runs under a guard: one that
raises (a ``RecoveryError``, anything) or reports FAIL is printed as failed, the
allocator cap is lifted and the cache emptied, and the next part runs; the last
table lists every part's result, and the exit code is 1 when any part failed.
Exits with code 2 and one line when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
import traceback
from collections.abc import Callable, Iterator

import numpy as np
from markdown_table import measured_under, print_table


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
    from napari_finetune.loading import load_checkpoint
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


@contextlib.contextmanager
def tf32_off() -> Iterator[None]:
    """True fp32 for matmuls and cuDNN convolutions (cuDNN's default is TF32), put back after."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    # Setting the old switches also moves torch's newer fp32_precision settings
    # (matmul "none" -> "ieee"), which change CPU bf16 results afterwards: those
    # are put back as they were too.
    newer = [
        (module, module.fp32_precision)
        for module in (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
        if hasattr(module, "fp32_precision")
    ]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
        for module, value in newer:
            module.fp32_precision = value


def speed(image, corrections, device: str, steps: int, batch: int, patch) -> None:
    """Part 1 table: a full fine-tune, mixed precision against true fp32 (TF32 off)."""
    from napari_finetune.config import FinetuneConfig

    rows = []
    for mixed in (False, True):
        config = FinetuneConfig(
            steps=steps,
            batch_size=batch,
            patch_shape=patch,
            device=device,
            mode="full",
            mixed_precision=mixed,
            cpu_bf16=mixed,
            seed=0,
        )
        with contextlib.nullcontext() if mixed else tf32_off():
            per_step, statuses = timed_run(image, corrections, config)
        last = statuses[-1]
        rows.append(
            [
                f"{'mixed' if mixed else 'fp32 (TF32 off)'}",
                last.dtype,
                str(last.grad_scaler),
                f"{last.batch_size}x{last.accumulation}",
                f"{per_step:.3f}",
                f"{batch / per_step:.1f}",
            ]
        )
    rows[1].append(f"{float(rows[0][4]) / float(rows[1][4]):.2f}x")
    rows[0].append("1.00x")
    print(f"1. step speed, full fine-tune, batch {batch} x {'x'.join(map(str, patch))}, "
          f"{steps} steps; the fp32 row with TF32 off (matmul and cuDNN)")
    header = ["run", "dtype", "GradScaler", "batch x acc", "s/step", "samples/s", "speed-up"]
    print_table(header, rows)


def oom_recovery(image, corrections, device: str, batch: int, patch, dry_run: bool) -> bool:
    """Parts 2 and 3: a capped allocator, the ladder, memory after the run."""
    import torch

    from napari_finetune.config import FinetuneConfig

    # Autobatch off: with it on the run picks a fitting micro-batch before step 1
    # and the ladder is never exercised on real CUDA errors.
    config = FinetuneConfig(steps=4, batch_size=batch, patch_shape=patch, device=device,
                            seed=0, autobatch=False)
    before = _memory(device)
    hook = None
    if dry_run:
        from napari_finetune.testing import oom_above_batch

        def hook(trainer):  # noqa: ANN001 - the CPU has no allocator cap: inject instead
            oom_above_batch(trainer.model, max(1, batch // 4))
    else:
        # Measure one sample's step, then cap the allocator at ~3 samples' worth.
        one = FinetuneConfig(steps=2, batch_size=1, patch_shape=patch, device=device, seed=0,
                             autobatch=False)
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
    try:
        _, statuses = timed_run(image, corrections, config, after_build=hook)
    finally:
        if not dry_run:
            torch.cuda.set_per_process_memory_fraction(1.0)
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
    return ok and back


def _memory(device: str) -> tuple[float, float]:
    import torch

    if not device.startswith("cuda"):
        return 0.0, 0.0
    return torch.cuda.memory_allocated() / 2**20, torch.cuda.memory_reserved() / 2**20



def autobatch_vs_limit(image, corrections, device: str, patch, dry_run: bool) -> bool:
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
    return ok


def default_run(image, corrections, device: str, steps: int) -> bool:
    """Part 0: the widget's defaults on the device, as a new user runs them."""
    import dataclasses

    from napari_finetune.config import FinetuneConfig

    config = dataclasses.replace(FinetuneConfig(), steps=steps, device=device)
    if device == "cpu":  # the dry run: the defaults' patch and batch are too big for it
        config = dataclasses.replace(config, batch_size=2, patch_shape=(8, 32, 32))
    t = time.perf_counter()
    try:
        _, statuses = timed_run(image, corrections, config)
    except Exception as exc:  # the crash this part exists to catch: print it, go on
        print(f"0. default run on {device}: FAIL, {type(exc).__name__}: {exc}\n")
        return False
    last = statuses[-1]
    ok = last.kind == "finished" and last.step == steps
    auto = [s.message for s in statuses if s.message.startswith("autobatch:")]
    # The probe's verdict: mixed precision against fp32 on the first batch, with the
    # measured cosine (on real cuDNN this is the check that a conv3d bug is caught).
    auto += [s.message for s in statuses if s.message.startswith("precision probe")]
    print(
        f"0. default run on {device} (FinetuneConfig() but steps={steps}): "
        f"{'PASS' if ok else 'FAIL'}, {last.step}/{steps} steps in "
        f"{time.perf_counter() - t:.1f} s, {last.dtype}, micro-batch {last.batch_size} x "
        f"{last.accumulation}"
    )
    for line in auto:
        print(f"   {line}")
    print()
    return ok


def finetuner_vs_bare(device: str, dry_run: bool) -> None:
    """Part 5: the Finetuner's step against a hand-written loop (bench_trainer_throughput)."""
    import argparse

    from bench_trainer_throughput import measure

    args = argparse.Namespace(
        device=device, patch=[8, 16, 16] if dry_run else [32, 64, 64],
        batch=2 if dry_run else 8, depth=2 if dry_run else 3, features=4 if dry_run else 16,
        rounds=2 if dry_run else 6, block=2 if dry_run else 10,
        mixed_precision=True, cpu_bf16=dry_run,
    )
    rows = []
    for validation in (0.0, 0.1):
        r = measure(args, False, "full", validation)
        rows.append([
            "off" if not validation else "on (defaults)", r["dtype"],
            f"{r['finetuner_ms']:.1f}", f"{r['bare_ms']:.1f}", f"{r['ratio']:.2f}",
            f"{r['wall_ratio']:.2f}", str(r["n"]),
        ])
    print(
        f"5. Finetuner vs a bare loop: UNet depth {args.depth}, {args.features} features, "
        f"batch {args.batch} x {'x'.join(map(str, args.patch))}, full fine-tune, "
        "interleaved (goal >= 0.90 with validation off)"
    )
    print_table(["validation", "dtype", "Finetuner ms/step", "bare ms/step",
                 "ratio (median step)", "wall ratio (checks included)", "steps"], rows)
    print()


def time_to_quality(device: str, dry_run: bool, budget_s: float, dense_s: float) -> None:
    """Part 6: held-out IoU against seconds from the click on an unseen appearance
    (``bench_time_to_quality``, the volume made here: no zarr on a GPU server)."""
    from bench_adaptation import UNSEEN_SEED, unseen_appearance
    from bench_time_to_quality import HEADER, appearance_rows

    from napari_finetune.loading import load_checkpoint
    from napari_finetune.samples.synthetic_em import generate_volume, sample_checkpoint_path

    shape = (16, 64, 64) if dry_run else (64, 256, 256)
    image, truth = generate_volume(shape, UNSEEN_SEED, appearance=unseen_appearance())
    marks = [m for m in (2, 5, 10, 20, 30, 60, 120) if m <= budget_s] or [budget_s]
    rows, summary = appearance_rows("unseen", image, truth,
                                    load_checkpoint(sample_checkpoint_path()), device, marks,
                                    dense_s, small=dry_run)
    print(f"6. time to quality at the widget's defaults, {summary}")
    print_table(HEADER, rows)
    print()


def prediction_speed(device: str, dry_run: bool) -> None:
    """Part 7: blockwise prediction against the model alone on the whole volume."""
    import torch

    from napari_finetune.config import PredictConfig
    from napari_finetune.predict import inference_mode, launch_batch, predict_volume

    shape = (16, 64, 64) if dry_run else (128, 512, 512)
    image = np.random.default_rng(0).normal(100, 20, size=shape).astype(np.float32)
    model, _ = load_model()
    model = model.to(device)
    voxels = image.size

    def alone() -> None:
        with inference_mode(model):
            launch_batch(model, ((image - 50.0) / 100.0)[None], device).result()

    def blockwise(block) -> None:
        config = PredictConfig(device=device, **({"block_shape": block} if block else {}))
        predict_volume(model, image, (50.0, 150.0), config)

    cases = [("model alone, one call", alone),
             ("predict_volume, default block", lambda: blockwise(None)),
             ("predict_volume, one block", lambda: blockwise(shape))]
    rows, reference = [], None
    for name, run in cases:
        run()  # warm-up (cuDNN autotuning, allocator)
        times = []
        for _ in range(3):
            _sync(device)
            t = time.perf_counter()
            run()
            _sync(device)
            times.append(time.perf_counter() - t)
        best = min(times)
        rate = voxels / best / 1e6
        reference = reference or rate
        rows.append([name, f"{best * 1e3:.0f}", f"{rate:.1f}", f"{rate / reference:.2f}"])
    model.to("cpu")
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    print(f"7. prediction, sample model, {'x'.join(map(str, shape))} (goal >= 0.80 of alone)")
    print_table(["case", "ms", "Mvoxel/s", "of the model alone"], rows)
    print()


def cuda_matrix(dry_run: bool) -> bool:
    """Part 8: the fake's argument matrix against the real ``torch.cuda`` (FakeCuda when dry)."""
    import torch

    from napari_finetune.testing.cuda import FakeCuda
    from napari_finetune.testing.cuda_matrix import run_matrix

    if dry_run:
        with FakeCuda(initialized=False, device_count=2):
            rows = run_matrix(torch.cuda)
        where = "FakeCuda (dry run), 2 devices"
    else:
        rows = run_matrix(torch.cuda)
        where = f"torch.cuda, {torch.cuda.device_count()} device(s)"
    wrong = [r for r in rows if not r.ok]
    print(f"8. the CUDA fake's argument matrix against {where}: {len(rows) - len(wrong)} of "
          f"{len(rows)} rows as expected")
    print_table(
        ["function", "argument", "expected", "got", "ok"],
        [[r.function, r.argument, r.expected, r.got, "yes" if r.ok else "NO"] for r in rows],
    )
    print()
    return not wrong


def host_syncs(image, corrections, device: str, patch, dry_run: bool) -> bool:
    """Part 9: synchronising calls per attempt at an optimizer step, bf16 (goal 1)."""
    import dataclasses
    import warnings

    import torch

    from napari_finetune.config import FinetuneConfig
    from napari_finetune.testing.host_reads import HostReads
    from napari_finetune.trainer import loop

    config = dataclasses.replace(
        FinetuneConfig(), steps=4, batch_size=2, patch_shape=tuple(patch), device=device,
        mixed_precision=True, cpu_bf16=dry_run, autobatch=False, validation_fraction=0.0,
    )
    counts: list[tuple[str, str, int]] = []
    original = loop.run_step

    def counted_step(parts, *args, **kwargs):  # noqa: ANN001, ANN202 - run_step's own
        if dry_run:
            with HostReads(parts.device, parts.model.parameters()) as reads:
                outcome = original(parts, *args, **kwargs)
            n = len(reads.reads)
        else:
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    outcome = original(parts, *args, **kwargs)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            n = sum("synchroniz" in str(w.message) for w in caught)
        counts.append((parts.precision.dtype_name, outcome.kind, n))
        return outcome

    loop.run_step = counted_step
    try:
        _, statuses = timed_run(image, corrections, config)
    finally:
        loop.run_step = original
    how = "reads of device values (HostReads)" if dry_run else "sync warnings"
    print(f"9. host syncs per attempt at an optimizer step ({how}), goal 1 under bf16")
    print_table(["attempt", "dtype", "outcome", "syncs"],
                [[str(i + 1), d, k, str(n)] for i, (d, k, n) in enumerate(counts)])
    print()
    bf16 = [n for d, _, n in counts if d == "bfloat16"]
    if not bf16:  # nothing measured: the probe (or step 1) fell back to fp32
        probe = [s.message for s in statuses if s.message.startswith("precision probe")]
        print(f"   no attempt ran under bf16: FAIL (nothing measured); {'; '.join(probe)}\n")
    return bool(bf16) and all(n <= 1 for n in bf16)


PARTS = ("matrix", "default", "speed", "oom", "autobatch", "bare", "quality", "predict",
         "syncs")


def release_device() -> None:
    """After a part, whatever it left: the allocator cap lifted, garbage and cache freed."""
    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def run_parts(parts: list[tuple[str, Callable[[], object]]]) -> list[tuple[str, str]]:
    """Run every part, each under a guard; (part, result) for the closing table.

    A part that raises (a RecoveryError, anything but a KeyboardInterrupt) is
    printed as failed with its traceback on stderr, and the next part runs; one
    that returns False (it printed FAIL) is failed too.
    """
    results = []
    for name, part in parts:
        try:
            ok = part()
        except Exception as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            print(f"{name}: FAILED, {type(exc).__name__}: {message}; going on\n", flush=True)
            traceback.print_exc()
            results.append((name, f"FAIL ({type(exc).__name__}: {message})"))
        else:
            results.append((name, "FAIL" if ok is False else "done"))
        finally:
            release_device()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="run every part on the CPU with tiny sizes (no timing value)",
    )
    parser.add_argument("--steps", type=int, default=12, help="steps per speed run")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--quality-s", type=float, default=30.0,
                        help="training seconds of each time-to-quality run")
    parser.add_argument("--dense-s", type=float, default=40.0,
                        help="training seconds of the dense bound")
    args = parser.parse_args(argv)

    import torch

    started = time.perf_counter()
    results: list[tuple[str, str]] = []
    if "matrix" in args.parts and (args.cpu_dry_run or torch.cuda.is_available()):
        # First, while CUDA is not started: some rows ask what torch answers then.
        results += run_parts([("matrix", lambda: cuda_matrix(args.cpu_dry_run))])
    if args.cpu_dry_run:
        device, shape, batch, patch, steps = "cpu", (16, 64, 64), 4, (8, 32, 32), 4
        quality_s, dense_s = min(args.quality_s, 2.0), min(args.dense_s, 2.0)
        print(f"CPU dry run, torch {torch.__version__}; measured at {measured_under()}\n")
    elif not torch.cuda.is_available():
        print(
            "bench_gpu.py: no CUDA device (torch.cuda.is_available() is False); nothing "
            "measured. Run it on a GPU machine, or use --cpu-dry-run to check the script.",
            file=sys.stderr,
        )
        return 2
    else:
        device, shape, batch, patch, steps = "cuda", (64, 256, 256), 8, (32, 64, 64), args.steps
        quality_s, dense_s = args.quality_s, args.dense_s
        props = torch.cuda.get_device_properties(0)
        print(
            f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, capability "
            f"{props.major}.{props.minor}, torch {torch.__version__} (CUDA "
            f"{torch.version.cuda}), bf16 supported: {torch.cuda.is_bf16_supported()}; "
            f"measured at {measured_under()}\n"
        )
    image, corrections = make_data(shape)
    dry = args.cpu_dry_run
    every = {
        # The dry run's 8x32x32 patch leaves a 2x8x8 bottleneck, where CPU bf16 can
        # overflow (the probe then trains in fp32 and there is nothing to count).
        "syncs": lambda: host_syncs(
            image, corrections, device, (16, 32, 32) if dry else patch, dry
        ),
        "default": lambda: default_run(image, corrections, device, 3 if dry else 10),
        "speed": lambda: speed(image, corrections, device, steps, batch, patch),
        "oom": lambda: oom_recovery(image, corrections, device, 2 * batch, patch, dry),
        "autobatch": lambda: autobatch_vs_limit(image, corrections, device, patch, dry),
        "bare": lambda: finetuner_vs_bare(device, dry),
        "quality": lambda: time_to_quality(device, dry, quality_s, dense_s),
        "predict": lambda: prediction_speed(device, dry),
    }
    results += run_parts([(name, every[name]) for name in PARTS if name in every
                          and name in args.parts])
    print("parts")
    print_table(["part", "result"], [list(r) for r in results])
    failed = [name for name, result in results if result.startswith("FAIL")]
    print(f"bench_gpu.py: {time.perf_counter() - started:.0f} s in all"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
