"""Several processes fine-tuning one model: one ladder agreed by every rank.

Started by ``torchrun`` (or ``napari-finetune train --nproc N``, which runs it),
each process (rank) draws its own patches (seed + rank), and every decision of
a step is taken by all ranks together through :class:`RankSync`:

* after each attempt every rank says whether it ran out of memory (an
  ``all_reduce`` of one flag per rank); if any did, every rank undoes the
  attempt and steps down the same rung of the ladder, at the same step;
* the step's painted-voxel counts and its loss are summed over the ranks, so a
  non-finite result on any rank sends every rank to fp32 together, and the
  step's loss is the one a single process would compute on all the samples;
* the gradients are summed only once every rank finished its micro-batches
  (the counts already divide by the whole step), so a failed attempt's
  gradients are never exchanged; the optimizer step is all or nothing on
  every rank; autobatch takes the smallest micro-batch of the ranks.

Why not the ``DistributedDataParallel`` wrapper: its reducer all-reduces
gradient buckets inside ``backward``, while the micro-batches of a rank that
will run out of memory later are still running, and an exception inside
``backward`` leaves the reducer expecting buckets that never come. Summing the
gradients ourselves, once, after the ranks agreed the attempt succeeded, is
what its ``no_sync()`` + a final reduce would do, without that hazard.

Without ``torch.distributed`` initialised nothing here is used: the single
process path is :class:`~napari_finetune.trainer.sync.LocalSync`.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist

from napari_finetune.config import FinetuneConfig
from napari_finetune.errors import first_line
from napari_finetune.trainer.losses import Normalisers
from napari_finetune.trainer.sync import LocalSync

# Gradients are summed in chunks of about this many bytes.
BUCKET_BYTES = 32 * 2**20


class DistributedError(RuntimeError):
    """A collective failed: another rank is gone or stopped answering."""


def world_size_from_env() -> int:
    """``WORLD_SIZE`` as torchrun sets it (1 when not launched by it)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def start(device_type: str, timeout_s: float) -> RankSync:
    """Join the process group torchrun described in the environment.

    nccl on CUDA, gloo on the CPU. On CUDA each rank takes the GPU of its
    ``LOCAL_RANK``. ``timeout_s``: how long a collective waits for the other
    ranks before the run ends with :class:`DistributedError` (a rank killed,
    or stuck); longer than any pause between two steps.
    """
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=float(timeout_s)))
    return RankSync()


def stop() -> None:
    """Leave the process group (when one was joined)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def rank_device(device: str) -> str:
    """The device of this rank: ``cuda`` becomes ``cuda:LOCAL_RANK``; others stay."""
    if device.startswith("cuda") and ":" not in device:
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def per_rank_config(
    config: FinetuneConfig, world_size: int, global_samples: int | None = None
) -> FinetuneConfig:
    """The config of one rank.

    Without ``global_samples`` each rank trains ``config.samples_per_step`` (the
    step has ``world_size`` times as many). With it, the step has that many in
    total: each rank ``global_samples / world_size``, cut into the largest
    micro-batch up to ``config.batch_size`` that divides it.

    Raises
    ------
    ValueError
        ``global_samples`` is not a multiple of the number of ranks.
    """
    if global_samples is None:
        return config
    if global_samples < world_size or global_samples % world_size:
        raise ValueError(
            f"--global-samples {global_samples} cannot be shared by {world_size} ranks: give a "
            f"multiple of {world_size}, e.g. {max(1, global_samples // world_size) * world_size}."
        )
    share = global_samples // world_size
    batch = max(d for d in range(1, min(config.batch_size, share) + 1) if share % d == 0)
    return dataclasses.replace(config, batch_size=batch, accumulation=share // batch)


class RankSync(LocalSync):
    """The decisions of a step, agreed by every rank of the default process group.

    Every method is a collective: every rank calls the same ones in the same
    order (the loop guarantees it, since every branch it takes is agreed).
    A collective that fails (a rank killed, the timeout passed) raises
    :class:`DistributedError` with one line.
    """

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        nccl = dist.get_backend() == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else None
        self.flagged: list[int] = []  # the ranks that raised the last flag

    def _tensor(self, values: Sequence[float], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device or "cpu")

    def _all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType) -> torch.Tensor:
        try:
            dist.all_reduce(tensor, op=op)
        except RuntimeError as exc:
            raise DistributedError(lost_line(self.rank, self.world_size, exc)) from None
        return tensor

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (which ones: ``flagged``)."""
        one_hot = [0.0] * self.world_size
        one_hot[self.rank] = float(bool(flag))
        summed = self._all_reduce(self._tensor(one_hot, torch.float32), dist.ReduceOp.SUM)
        self.flagged = [r for r, v in enumerate(summed.tolist()) if v > 0]
        return bool(self.flagged)

    def smallest(self, value: int) -> int:
        """The smallest ``value`` of all ranks."""
        return int(self._all_reduce(self._tensor([value], torch.int64), dist.ReduceOp.MIN))

    def total(self, value: float) -> float:
        """``value`` summed over the ranks (NaN anywhere makes it NaN)."""
        return float(self._all_reduce(self._tensor([value], torch.float64), dist.ReduceOp.SUM))

    def normalisers(self, local: Normalisers) -> Normalisers:
        """The counts of the whole step: every rank's samples."""
        # Every rank counts the same label values (the model's channels), so the
        # per-label counts sum position by position.
        counts = [local.supervised, local.distillation, local.hold, *local.per_label]
        summed = self._all_reduce(self._tensor(counts, torch.int64), dist.ReduceOp.SUM).tolist()
        supervised, distillation, hold, *per_label = (int(v) for v in summed)
        return Normalisers(supervised, distillation, hold, tuple(per_label), local.groups)

    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the ranks' gradients, in flat buckets (one collective per bucket).

        Every rank has a gradient for the same parameters: the ranks run the same
        model with the same terms (the teacher is dropped on all of them at once).
        """
        for bucket in _buckets([p.grad for p in params if p.grad is not None]):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            self._all_reduce(flat, dist.ReduceOp.SUM)
            offset = 0
            for grad in bucket:
                grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                offset += grad.numel()

    def align(self, model: torch.nn.Module) -> None:
        """Every rank starts from rank 0's weights and buffers."""
        self._broadcast(list(model.parameters()) + list(model.buffers()))

    def align_buffers(self, model: torch.nn.Module) -> None:
        """After a step: rank 0's BatchNorm statistics on every rank (as DDP does)."""
        self._broadcast(list(model.buffers()))

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        try:
            with torch.no_grad():
                for tensor in tensors:
                    dist.broadcast(tensor.data, src=0)
        except RuntimeError as exc:
            raise DistributedError(lost_line(self.rank, self.world_size, exc)) from None

    def failure_line(self, own: str | None, what: str) -> str:
        """This rank's own failure line, or which rank failed."""
        if own:
            return own
        others = ", ".join(str(r) for r in self.flagged if r != self.rank)
        return f"{what} (rank {others})" if others else what


def _buckets(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Gradients grouped by dtype and device into buckets of about BUCKET_BYTES."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for grad in grads:
        last = buckets[-1] if buckets else None
        same = last is not None and last[0].dtype == grad.dtype and last[0].device == grad.device
        if not same or size + grad.numel() * grad.element_size() > BUCKET_BYTES:
            buckets.append([])
            size = 0
        buckets[-1].append(grad)
        size += grad.numel() * grad.element_size()
    return buckets


def lost_line(rank: int, world_size: int, exc: BaseException) -> str:
    """One line for a failed collective: which rank noticed, and what it means."""
    return (
        f"rank {rank} of {world_size} lost the other ranks ({first_line(exc)[:160]}); one of them "
        "failed or was killed: see its output above"
    )
