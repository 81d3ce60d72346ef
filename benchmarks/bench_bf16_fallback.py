"""How often a CPU-bf16 run of the sample model gives bf16 up, in fresh processes.

The configuration of the report that started this: the sample model, a
(32, 96, 96) sample volume with two painted slices, ``FinetuneConfig(steps=6,
batch_size=2, patch_shape=(16, 64, 64), device="cpu", mixed_precision=True,
cpu_bf16=True, validation_fraction=0.0, seed=0, autobatch=False)``, run again
and again, each run in a fresh process (torch's CPU bf16 kernels glitch now and
then: one process tells nothing). Printed: how many runs ended in bf16, how
many bad steps were redone in fp32, and whether same-seed fp32 runs are
identical (their final losses, to every digit).

    python benchmarks/bench_bf16_fallback.py [--runs 20] [--fp32-runs 3]

With ``PYTHONPATH`` at the ``src`` of an older commit it measures that commit
(the "before" in docs/benchmarks.md); what an old commit cannot report (its
bad steps) is shown as "n/a".
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap

from markdown_table import measured_under, print_table

RUN = textwrap.dedent("""
    import sys
    import numpy as np
    from napari_finetune.config import FinetuneConfig
    from napari_finetune.loading import load_checkpoint
    from napari_finetune.samples.synthetic_em import generate_volume, sample_checkpoint_path
    from napari_finetune.trainer.loop import Finetuner

    bf16 = sys.argv[1] == "bf16"
    image, truth = generate_volume((32, 96, 96), seed=0)
    corrections = np.zeros(image.shape, np.uint8)
    for z in (8, 20):
        corrections[z] = truth[z] + 1  # background 1, membrane 2, mitochondria 3
    config = FinetuneConfig(steps=6, batch_size=2, patch_shape=(16, 64, 64), device="cpu",
                            mixed_precision=bf16, cpu_bf16=bf16, validation_fraction=0.0,
                            seed=0, autobatch=False)
    trainer = Finetuner.from_checkpoint(
        load_checkpoint(sample_checkpoint_path()), image, corrections, config)
    events = list(trainer.run())
    bad = getattr(trainer.precision, "bad_steps", None)
    print("RESULT", events[-1].kind, events[-1].dtype, repr(events[-1].loss),
          "n/a" if bad is None else ",".join(map(str, bad)) or "-")
""")


def one_run(precision: str) -> tuple[str, str, str, str]:
    """(how it ended, final dtype, final loss, bad steps) of one fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", RUN, precision], capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return "failed", "-", "-", last[:80]
    _, kind, dtype, loss, bad = lines[-1].split(" ", 4)
    return kind, dtype, loss, bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="bf16 runs (fresh processes)")
    parser.add_argument("--fp32-runs", type=int, default=3, help="fp32 runs, same seed")
    args = parser.parse_args()
    bf16 = [one_run("bf16") for _ in range(args.runs)]
    fp32 = [one_run("fp32") for _ in range(args.fp32_runs)]
    print(measured_under())
    print()
    ended_bf16 = sum(1 for kind, dtype, _, _ in bf16 if kind == "finished" and dtype == "bfloat16")
    redone = [bad for *_, bad in bf16 if bad not in ("-", "n/a")]
    losses = {loss for _, _, loss, _ in bf16}
    print_table(
        ["runs", "ended in bf16", "runs with a step redone in fp32", "bad steps (per run)",
         "distinct final losses (bf16)", "fp32 runs identical"],
        [[str(len(bf16)), f"{ended_bf16} of {len(bf16)}",
          "n/a" if any(bad == "n/a" for *_, bad in bf16) else str(len(redone)),
          "; ".join(redone) or "none", str(len(losses)),
          "yes" if len({loss for _, _, loss, _ in fp32}) == 1 else
          f"no: {sorted({loss for _, _, loss, _ in fp32})}"]],
    )
    print_table(["run", "ended", "dtype", "final loss", "bad steps"],
                [[str(i + 1), *row] for i, row in enumerate(bf16)])


if __name__ == "__main__":
    main()
