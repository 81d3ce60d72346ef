"""``train`` on several processes: the ``--nproc`` launcher and each rank's set-up.

``napari-finetune train --nproc N ...`` runs ``python -m torch.distributed.run
--standalone --nproc-per-node N -m napari_finetune.cli train ...`` (the same
arguments without ``--nproc``) and returns its exit code; ``torchrun
--nproc-per-node N -m napari_finetune.cli train ...`` is the same thing typed
by hand (and what a cluster's launcher runs). Each rank then joins the process
group (:mod:`napari_finetune.trainer.distributed`); rank 0 alone prints and
writes the export.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from napari_finetune.cli.run import RunOutcome, run_finetune
from napari_finetune.config import FinetuneConfig

if TYPE_CHECKING:
    import numpy as np

    from napari_finetune.arrays import AxesImage, VolumeArray
    from napari_finetune.model.checkpoint import Checkpoint

# Seconds a collective waits for the other ranks before the run ends with an
# error (a rank killed, or stuck): longer than any pause between two steps.
DEFAULT_TIMEOUT_S = 600.0


def add_options(parser: argparse.ArgumentParser) -> None:
    """``--nproc``, ``--global-samples`` and ``--collective-timeout``."""
    group = parser.add_argument_group("several processes (one per GPU; see docs/multi-gpu.md)")
    group.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="train with N processes on this machine (runs torchrun); each draws its own "
        "patches, so a step has N times the samples unless --global-samples is given",
    )
    group.add_argument(
        "--global-samples",
        type=int,
        default=None,
        metavar="N",
        help="samples per optimizer step over all processes (shared equally between them)",
    )
    group.add_argument(
        "--collective-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="seconds a process waits for the others before ending with an error "
        "(default: %(default)s)",
    )


def launch(nproc: int, argv: Sequence[str]) -> int:
    """Run this ``train`` command under torchrun with ``nproc`` processes; its exit code.

    Raises
    ------
    ValueError
        ``nproc`` is below 1.
    """
    if nproc < 1:
        raise ValueError(f"--nproc {nproc}: give at least 1 process.")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}", "-m", "napari_finetune.cli", *without_nproc(argv),
    ]
    try:
        return subprocess.run(command, check=False).returncode
    except KeyboardInterrupt:  # torchrun passed it on to the ranks; they export and exit
        return 130


def without_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--nproc N`` / ``--nproc=N``."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def run_rank(
    ckpt: Checkpoint,
    image: VolumeArray | AxesImage,
    corrections: np.ndarray,
    config: FinetuneConfig,
    args: argparse.Namespace,
) -> RunOutcome:
    """This process's part of a torchrun launch: join the group, train, leave.

    Rank 0 prints and exports; the others are silent unless they lose the
    other ranks (then they say so, in one line). ``image`` is the store's image
    as the model takes it: a store with channels (all of them, or the one
    ``--channel`` picks) or time points comes as an ``AxesImage``, the same as
    for one process, so each rank draws its patches from the painted time points.
    """
    import torch

    from napari_finetune.devices import resolve_device
    from napari_finetune.trainer import distributed

    # cuda -> cuda:LOCAL_RANK, checked to exist (one line naming the GPUs there are).
    device = resolve_device(distributed.rank_device(resolve_device(config.device)))
    config = dataclasses.replace(config, device=device)
    sync = distributed.start(torch.device(device).type, args.collective_timeout)
    outcome = run_finetune(
        ckpt, image, corrections, config, args.out, quiet=args.quiet or sync.rank > 0, sync=sync,
        fit_patch=args.patch_shape is None,
    )
    if outcome.error is None:  # after a lost rank, leaving the group could wait for it
        distributed.stop()
    return outcome
