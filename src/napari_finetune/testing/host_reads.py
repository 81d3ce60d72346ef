"""Count the host reads of values computed on the run's device, on a machine without a GPU.

A read of a device value on the host (``float(loss)``, ``bool(finite)``,
``.item()``, ``.tolist()``, ``.cpu()``...) waits for every kernel queued before
it: a GPU step that reads three numbers stalls its queue three times. On the
CPU nothing stalls and every tensor is on the same device, so
:class:`HostReads` tells the values that would be on the device from those
that stay on the host by where they come from: a model parameter, its
gradient, a tensor sent to the run's device or made there, and everything
computed from one of these is a device value; a tensor made from numpy (the
labels' counts) or by the optimizer on the host (AdamW's step counters) is
not. A read of a device value is counted.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

# The calls that bring a tensor's value to the host (a device sync on a GPU).
READS = frozenset({
    torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__bool__, torch.Tensor.__int__,
    torch.Tensor.__index__, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu,
})


@dataclass(frozen=True)
class Read:
    """One host read: the call (``"__float__"``) and where it was made (``"step.py:168"``)."""

    call: str
    where: str


class HostReads(TorchFunctionMode):
    """A torch function mode counting host reads of device values; a context manager.

    Parameters
    ----------
    device : str or torch.device
        The run's device (``"cpu"`` for a run on the CPU that stands in for a GPU).
    sources : iterable of torch.Tensor
        Tensors already on the device (the model's parameters).

    Attributes
    ----------
    reads : list of Read
        Every read of a device value, in order.
    """

    def __init__(self, device: str | torch.device, sources: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.reads: list[Read] = []
        self._on_device: WeakIdKeyDictionary = WeakIdKeyDictionary()
        for tensor in sources:
            self._on_device[tensor] = True

    def on_device(self, tensor: object) -> bool:
        """Whether ``tensor`` is a device value."""
        return isinstance(tensor, torch.Tensor) and tensor in self._on_device

    def _mark(self, func: Callable[..., object], result: object, inputs: list[object]) -> None:
        # A call that hands its inputs back marks them only when it wrote into
        # them (an in-place op: ``total += loss``); torch's grouping of an
        # optimizer's tensors by device leaves a host tensor among them on the
        # host (AdamW's step counters).
        name = getattr(func, "__name__", "")
        in_place = name.endswith("_") and not name.startswith("__") or name.startswith("__i")
        given = {id(leaf) for leaf in inputs}
        for leaf in tree_leaves(result):
            if isinstance(leaf, torch.Tensor) and (in_place or id(leaf) not in given):
                self._on_device[leaf] = True

    def _made_on_device(self, func: Callable[..., object], args: Sequence[object],
                        kwargs: Mapping[str, object]) -> bool:
        if func is torch.Tensor.to:
            targets = [a for a in [*args[1:], kwargs.get("device")]
                       if isinstance(a, (str, int, torch.device))]
            return any(torch.device(t) == self.device for t in targets)
        # A factory: on the CPU the host's own tensors are made there too
        # (AdamW's step counters, device="cpu"), so only a GPU run's count.
        device = kwargs.get("device")
        return (
            self.device.type != "cpu" and isinstance(device, (str, int, torch.device))
            and torch.device(device) == self.device
        )

    def __torch_function__(
        self,
        func: Callable[..., object],
        types: Sequence[type],
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
    ) -> object:
        kwargs = dict(kwargs or {})
        inputs = tree_leaves((list(args), kwargs))
        from_device = any(self.on_device(leaf) for leaf in inputs)
        if func in READS and args and self.on_device(args[0]):
            frame = traceback.extract_stack(limit=2)[0]
            where = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
            self.reads.append(Read(func.__name__, where))
            return func(*args, **kwargs)
        result = func(*args, **kwargs)
        if func in READS:
            return result
        # A parameter's .grad is read through its getter: from_device covers it.
        if from_device or self._made_on_device(func, args, kwargs):
            self._mark(func, result, inputs)
        return result
