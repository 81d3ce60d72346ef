"""The README.md of an exported bioimage.io package: what the model is and how it was made."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from napari_finetune import __version__


def _value(value: Any, nested: bool = False) -> str:
    """A record entry on one line; lists inside dicts keep brackets (patch_shape=[4, 8, 8])."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={_value(v, nested=True)}" for k, v in value.items()) or "{}"
    if isinstance(value, (list, tuple)):
        text = ", ".join(_value(v, nested=True) for v in value)
        return f"[{text}]" if nested or not text else text
    return str(value)


def readme_text(
    name: str,
    description: str,
    channel_names: Sequence[str],
    normalization: dict[str, Any],
    architecture: dict[str, Any],
    axes: str,
    test_shape: Sequence[int],
    source: str,
    source_sha256: str,
    run: dict[str, Any] | None,
) -> str:
    """Markdown for the package's ``documentation`` file.

    Parameters
    ----------
    run : dict, optional
        The checkpoint's run record (``metadata["run"]``); each entry becomes a line.
    """
    method = normalization.get("method", "percentile")
    if method == "percentile":
        norm = (
            f"percentiles {normalization['low']}-{normalization['high']} of each image mapped "
            "to 0-1 (bioimage.io `scale_range`)"
        )
    else:
        norm = (
            f"intensities {normalization['low']}-{normalization['high']} mapped to 0-1 "
            "(bioimage.io `scale_linear`)"
        )
    lines = [
        f"# {name}",
        "",
        description,
        "",
        "## Model",
        "",
        f"- Input: one channel, axes {axes.upper()}; each spatial size a multiple of the "
        f"model's (the test tensor is {' x '.join(str(s) for s in test_shape)}).",
        f"- Normalisation: {norm}.",
        f"- Output: one probability per channel and voxel (sigmoid of the model's logits); "
        f"channels: {', '.join(channel_names)}.",
        f"- Architecture: `{architecture.get('factory')}` with "
        f"{_value(architecture.get('kwargs'))}.",
        f"- Exported by napari-finetune {__version__} from `{source}` "
        f"(sha256 {source_sha256[:16]}...).",
        "",
        "The test tensors were cut from the centre of the volume given at export.",
        "",
        "## How it was made",
        "",
    ]
    if run:
        lines.append("Record of the napari-finetune fine-tuning run:")
        lines.append("")
        lines += [f"- {key}: {_value(value)}" for key, value in run.items()]
    else:
        lines.append("This checkpoint carries no record of a napari-finetune fine-tuning run.")
    lines += [
        "",
        "## Use",
        "",
        "In napari-finetune: `napari-finetune predict model.zip volume.ome.zarr`, or open "
        "the package in the Fine-tune widget's model field to fine-tune it further. Any "
        "bioimage.io consumer (bioimageio.core, ilastik, deepImageJ) reads the "
        "`pytorch_state_dict` or `torchscript` weights.",
        "",
    ]
    return "\n".join(lines)
