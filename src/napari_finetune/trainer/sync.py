"""Where an optimizer step's decisions are agreed: one process, or every rank.

A step asks the same questions whether it runs alone or as one rank of many:
did any attempt run out of memory, was any result non-finite, how many painted
voxels does the whole step have, what is the step loss. :class:`LocalSync`
answers them for one process (every answer is its own); the multi-process
answer, with collectives, is :class:`~napari_finetune.trainer.distributed.RankSync`.
Every rank asks the same questions in the same order, so a collective is never
left waiting for a rank that took another path.
"""

from __future__ import annotations

import torch

from napari_finetune.trainer.losses import Normalisers


class LocalSync:
    """One process: every decision is this process's own."""

    rank = 0
    world_size = 1

    @property
    def distributed(self) -> bool:
        """Whether other ranks take part."""
        return self.world_size > 1

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank."""
        return bool(flag)

    def smallest(self, value: int) -> int:
        """The smallest ``value`` of all ranks."""
        return int(value)

    def total(self, value: float) -> float:
        """``value`` summed over the ranks."""
        return float(value)

    def normalisers(self, local: Normalisers) -> Normalisers:
        """The counts of the whole step (every rank's samples)."""
        return local

    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the gradients of the ranks (nothing to do alone)."""

    def align(self, model: torch.nn.Module) -> None:
        """Make every rank's weights and buffers rank 0's (nothing to do alone)."""

    def align_buffers(self, model: torch.nn.Module) -> None:
        """Make every rank's buffers (BatchNorm statistics) rank 0's, after a step."""

    def failure_line(self, own: str | None, what: str) -> str:
        """The line for an agreed failure: this rank's own, or whose it was."""
        return own or what
