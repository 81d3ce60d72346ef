"""bioimage.io input preprocessing <-> napari-finetune's normalisation dict.

napari-finetune normalises in one of two ways
(:func:`napari_finetune.data.normalization.intensity_range`), both a linear map
``(x - low) / (high - low)``:

- ``{"method": "percentile", "low": p_lo, "high": p_hi}``: ``low``/``high`` are
  the image's percentiles; bioimage.io's ``scale_range`` does the same
  (``(x - v_lo) / (v_hi - v_lo + eps)``, eps 1e-6).
- ``{"method": "fixed", "low": v_lo, "high": v_hi}``: fixed values; any chain of
  bioimage.io's fixed affine steps (``scale_linear``, ``fixed_zero_mean_unit_variance``)
  is one such map, ``gain * x + offset`` with ``low = -offset / gain`` and
  ``high = low + 1 / gain``.

Steps computed per image that are not a percentile range (``zero_mean_unit_variance``,
``scale_mean_variance``) and steps that are not linear (``clip``, ``binarize``,
``custom``) have no equivalent: a package using them is refused with one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bioimageio.spec.model import v0_5

Normalization = dict[str, Any]
Step = v0_5.PreprocessingDescr

_FLOAT_TYPES = ("float32", "float64")


def _scalar(value: float | Sequence[float], op: str) -> float:
    """A per-channel kwarg as one number (the models here take one input channel)."""
    if isinstance(value, (int, float)):
        return float(value)
    values = [float(v) for v in value]
    if len(set(values)) != 1:
        raise ValueError(f"{op} has different values per channel ({values}), one channel expected")
    return values[0]


def _affine(step: Step) -> tuple[float, float] | None:
    """``(gain, offset)`` of a fixed affine step, None for any other step."""
    if isinstance(step, v0_5.ScaleLinearDescr):
        kw = step.kwargs
        return _scalar(kw.gain, "scale_linear"), _scalar(kw.offset, "scale_linear")
    if isinstance(step, v0_5.FixedZeroMeanUnitVarianceDescr):
        fixed = step.kwargs
        mean = _scalar(fixed.mean, "fixed_zero_mean_unit_variance")
        std = _scalar(fixed.std, "fixed_zero_mean_unit_variance")
        return 1.0 / std, -mean / std
    return None


def _tidy(value: float) -> float:
    # 1/gain and -offset/gain come back as 10.000000000000002; 12 digits are plenty.
    return float(f"{value:.12g}")


def normalization_from_preprocessing(steps: Sequence[Step]) -> Normalization:
    """The normalisation dict equivalent to a package's input preprocessing.

    Parameters
    ----------
    steps : sequence of bioimage.io v0.5 preprocessing descriptions
        ``InputTensorDescr.preprocessing``.

    Raises
    ------
    ValueError
        One line naming the steps when they have no equivalent.
    """
    ops = []
    for index, step in enumerate(steps):
        if isinstance(step, v0_5.EnsureDtypeDescr):
            # The first cast is to the input's own type; float casts change no value.
            if index == 0 or step.kwargs.dtype in _FLOAT_TYPES:
                continue
        ops.append(step)
    names = [str(getattr(op, "id", type(op).__name__)) for op in ops]
    supported = (
        "supported: scale_range (percentiles), scale_linear, fixed_zero_mean_unit_variance, "
        "or none"
    )
    if not ops:
        return {"method": "fixed", "low": 0.0, "high": 1.0}
    if len(ops) == 1 and isinstance(ops[0], v0_5.ScaleRangeDescr):
        kw = ops[0].kwargs
        if kw.reference_tensor is not None:
            raise ValueError(
                f"the input's scale_range takes its percentiles from another tensor "
                f"({kw.reference_tensor}), which napari-finetune cannot do ({supported})"
            )
        return {
            "method": "percentile",
            "low": float(kw.min_percentile),
            "high": float(kw.max_percentile),
        }
    gain, offset = 1.0, 0.0
    for op in ops:
        affine = _affine(op)
        if affine is None:
            raise ValueError(
                f"the input preprocessing {names} has no equivalent in napari-finetune's "
                f"normalisation ({supported})"
            )
        g, o = affine
        gain, offset = g * gain, g * offset + o
    if not gain > 0:
        raise ValueError(
            f"the input preprocessing {names} maps intensities with gain {gain}; "
            "napari-finetune's normalisation needs a positive gain"
        )
    low = -offset / gain
    return {"method": "fixed", "low": _tidy(low), "high": _tidy(low + 1.0 / gain)}


def preprocessing_from_normalization(
    spec: Normalization, spatial_axes: Sequence[str]
) -> list[Step]:
    """bioimage.io preprocessing steps that do what ``spec`` does.

    Parameters
    ----------
    spec : dict
        ``{"method": "percentile" | "fixed", "low": ..., "high": ...}``.
    spatial_axes : sequence of str
        Axis ids the percentiles are taken over (``"zyx"``: per image, as
        napari-finetune does).

    Raises
    ------
    ValueError
        An unknown method, or percentiles bioimage.io does not accept.
    """
    method = spec.get("method", "percentile")
    low, high = float(spec["low"]), float(spec["high"])
    if method == "percentile":
        if not (0.0 <= low < 100.0 and 1.0 < high <= 100.0 and low < high):
            raise ValueError(
                f"percentiles low={low}, high={high} cannot be written as bioimage.io "
                "scale_range (it needs 0 <= low < high, 1 < high <= 100)"
            )
        kwargs = v0_5.ScaleRangeKwargs(
            axes=[v0_5.AxisId(a) for a in spatial_axes],
            min_percentile=low,
            max_percentile=high,
        )
        return [v0_5.ScaleRangeDescr(kwargs=kwargs)]
    if method == "fixed":
        if not high > low:
            raise ValueError(f"fixed normalisation needs high > low, got low={low}, high={high}")
        gain = 1.0 / (high - low)
        return [v0_5.ScaleLinearDescr(kwargs=v0_5.ScaleLinearKwargs(gain=gain, offset=-low * gain))]
    raise ValueError(
        f"normalisation method {method!r} cannot be written as bioimage.io preprocessing "
        "(use 'percentile' or 'fixed')"
    )
