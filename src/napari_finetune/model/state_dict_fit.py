"""Say on one line which weights do not fit a model, keeping the key names.

torch's ``load_state_dict`` error spans one line per key; a CLI that prints
only the first line then shows "Error(s) in loading state_dict for UNet:" and
nothing a user can act on. This builds the same facts into one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

_SHOWN = 3  # key names per kind of problem; the rest is counted


def describe_mismatch(model: torch.nn.Module, state_dict: Mapping[str, object]) -> str:
    """One line naming missing, unexpected and mis-shaped keys (empty if they fit).

    Parameters
    ----------
    model : torch.nn.Module
        The model the weights are meant for.
    state_dict : mapping
        The weights; values that are not tensors count as mis-shaped.
    """
    expected = model.state_dict()
    missing = [key for key in expected if key not in state_dict]
    unexpected = [key for key in state_dict if key not in expected]
    mis_shaped = []
    for key, want in expected.items():
        if key not in state_dict:
            continue
        got = state_dict[key]
        got_shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        if got_shape != tuple(want.shape):
            mis_shaped.append(f"{key} (file {_shape(got_shape)}, model {_shape(want.shape)})")
    parts = [
        _listed(len(missing), "missing", missing),
        _listed(len(unexpected), "unexpected", unexpected),
        _listed(len(mis_shaped), "of another shape", mis_shaped),
    ]
    return "; ".join(part for part in parts if part)


def mismatch_line(model: torch.nn.Module, state_dict: object, exc: RuntimeError) -> str:
    """The key names that do not fit, on one line (torch's own text if none is found)."""
    line = describe_mismatch(model, state_dict) if isinstance(state_dict, dict) else ""
    return line or " ".join(str(exc).split())


def _shape(shape: Sequence[int] | str) -> str:
    return shape if isinstance(shape, str) else "[" + ", ".join(str(s) for s in shape) + "]"


def _listed(count: int, what: str, names: list[str]) -> str:
    if not count:
        return ""
    shown = ", ".join(names[:_SHOWN])
    more = f" and {count - _SHOWN} more" if count > _SHOWN else ""
    noun = "key" if count == 1 else "keys"
    return f"{count} {noun} {what}: {shown}{more}"
