"""``napari-finetune predict --workers N`` / ``--scheduler ADDRESS``: the prediction on
dask.distributed (:mod:`napari_finetune.predict.distributed`), with a progress bar.

``--workers N`` starts a LocalCluster of N worker processes on this machine
(torch threads per worker set so workers x threads <= cores) and prints its
dashboard address; ``--scheduler`` connects to a running cluster. A rerun of
the same command resumes where a killed one stopped. With ``--instances`` the
objects of every channel with a role are labelled on the cluster too. A store with
channels is read as the model takes them (``--channel`` for a single-channel model);
a time series gets a task per time point and region.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING

from napari_finetune.config import PredictConfig
from napari_finetune.errors import first_line

if TYPE_CHECKING:  # imported when the command runs, not with the CLI
    from distributed import Client
    from tqdm import tqdm

    from napari_finetune.objects import ChannelRole


def add_options(parser: argparse.ArgumentParser) -> None:
    """``--workers`` and ``--scheduler`` (one or the other)."""
    group = parser.add_argument_group("scale-out (dask.distributed; resumable)")
    either = group.add_mutually_exclusive_group()
    either.add_argument(
        "--workers", type=int, metavar="N",
        help="predict on a local dask cluster of N worker processes; a rerun of the same "
        "command skips the regions already written",
    )
    either.add_argument(
        "--scheduler", metavar="ADDRESS",
        help="predict on a running dask cluster (e.g. tcp://host:8786); its workers must see "
        "the store and the checkpoint at the same paths",
    )


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command asked for the distributed path."""
    return args.workers is not None or args.scheduler is not None


def run(args: argparse.Namespace, config: PredictConfig,
        instances: Mapping[str, ChannelRole] | None = None) -> int:
    """Predict ``args.volume`` with ``args.checkpoint`` on a dask cluster (with
    ``instances``, the objects of the channels with a role too); print the result."""
    from napari_finetune.cli import CLIError
    from napari_finetune.predict.distributed import (
        DistributedUnavailableError,
        predict_on_cluster,
        require_distributed,
    )
    from napari_finetune.predict.regions import PredictOutOfMemoryError

    try:
        require_distributed()
    except DistributedUnavailableError as exc:
        raise CLIError(str(exc)) from None
    if not args.checkpoint.exists():
        raise FileNotFoundError(2, "no such checkpoint", str(args.checkpoint))
    with ExitStack() as stack:
        client, threads = _connect(args, stack)
        bar = _Bar(args.quiet)
        stack.callback(bar.close)
        try:
            outcome = predict_on_cluster(
                args.checkpoint, args.volume, client, args.name, config,
                trust=args.trust_factory, torch_threads=threads,
                progress=bar.update, log=bar.write, instances=instances,
                voxel_size=args.voxel_size, channel=args.channel,
            )
        except PredictOutOfMemoryError as exc:
            raise CLIError(f"{exc} The previous labels of the store are kept.") from None
    print(
        f"{len(outcome.computed)} regions computed, {len(outcome.skipped)} already written "
        f"by an earlier run (of {outcome.total})"
    )
    for name, (labelled, relabelled) in outcome.blocks.items():
        print(f"{name}: {outcome.objects[name]} objects; {labelled} blocks labelled and "
              f"{relabelled} relabelled by this run")
    for name in outcome.names:
        print(f"wrote {args.volume}/labels/{name}")
    return 0


def _connect(args: argparse.Namespace, stack: ExitStack) -> tuple[Client, int | None]:
    """A client of a new local cluster or of ``--scheduler``, and torch threads per worker."""
    from distributed import Client

    from napari_finetune.cli import CLIError
    from napari_finetune.predict.distributed import local_cluster

    if args.scheduler is not None:
        try:
            client = stack.enter_context(Client(args.scheduler, timeout="20s"))
        except OSError as exc:
            raise CLIError(
                f"cannot reach the dask scheduler at {args.scheduler} ({first_line(exc)}); "
                "start one (dask scheduler, or dask-jobqueue) or check the address."
            ) from None
        print(f"dask scheduler {args.scheduler}: {len(client.scheduler_info()['workers'])} "
              f"workers; dashboard {client.dashboard_link}")
        return client, None  # the workers' own thread settings (set where they start)
    cluster, threads = local_cluster(args.workers)
    stack.callback(cluster.close)
    client = stack.enter_context(Client(cluster))
    print(f"local dask cluster: {args.workers} workers x {threads} torch threads; "
          f"dashboard {client.dashboard_link}")
    return client, threads


class _Bar:
    """A tqdm bar over regions, made at the first update (no empty bar before an error)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.bar: tqdm | None = None

    def update(self, done: int, total: int) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, unit="task", disable=self.quiet, file=sys.stderr,
                            dynamic_ncols=True)
        self.bar.n = done
        self.bar.refresh()

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
