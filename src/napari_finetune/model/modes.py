"""A model in eval mode for a while, each module's own train/eval flag put back after.

Per module, not ``model.train(flag)``: a training model may hold parts kept in
eval on purpose (a frozen teacher inside it, BatchNorm layers held at their
statistics), and putting the whole model back in training would wake them.
Prediction, the held-out checks and the geometry probe all borrow a model this way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """``model.eval()`` for the body; every module's ``training`` flag as it was after."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        yield
    finally:
        for module, training in modes:
            module.training = training
