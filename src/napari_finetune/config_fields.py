"""How a person sets each :class:`~napari_finetune.config.FinetuneConfig` field: one place.

The CLI (``cli/options.py``) checks its options against these ranges and the
widget's settings form (``_qt/settings.py``) builds its inputs from them, so
the two cannot disagree; the help text and the tooltips both come from the
field's entry in ``FinetuneConfig``'s docstring (:func:`field_docs`).
Plain Python, no Qt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEVICES = ("auto", "cpu", "cuda", "mps")


@dataclass(frozen=True)
class FieldSpec:
    """The inputs' limits of one field.

    Parameters
    ----------
    label : str
        Short name in the widget.
    low, high : float or None
        Smallest and largest value accepted (each item, for a tuple field).
    step : float or None
        Increment of the widget's arrow keys and wheel.
    choices : tuple of (str, str)
        ``(shown text, value)`` pairs of a field with a fixed set of values.
    advanced : bool
        Shown in the widget's collapsed "Advanced" section.
    """

    label: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    choices: tuple[tuple[str, str], ...] = ()
    advanced: bool = False

    def range_text(self) -> str:
        """"1 to 512"."""
        return f"{_number(self.low)} to {_number(self.high)}"

    def check(self, name: str, value: float) -> None:
        """Raise ValueError naming the field and its range when ``value`` is outside it."""
        if (self.low is not None and value < self.low) or (
            self.high is not None and value > self.high
        ):
            raise ValueError(f"{name} must be between {_number(self.low)} and "
                             f"{_number(self.high)}, got {_number(value)}.")


FIELDS: dict[str, FieldSpec] = {
    "steps": FieldSpec("Steps", 1, 1_000_000, 10),
    "learning_rate": FieldSpec("Learning rate", 1e-5, 1.0, 1e-5),
    "batch_size": FieldSpec("Batch", 1, 512, 1),
    "mode": FieldSpec("Mode", choices=(("LoRA adapters", "lora"), ("Full fine-tune", "full"))),
    "lora_rank": FieldSpec("LoRA rank", 1, 256, 1),
    "distillation": FieldSpec("Distillation", 0.0, 100.0, 0.1),
    "validation_fraction": FieldSpec("Held out", 0.0, 0.5, 0.01),
    "hold_other_channels": FieldSpec("hold other channels"),
    "mixed_precision": FieldSpec("mixed precision"),
    "autobatch": FieldSpec("Autobatch", advanced=True),
    "memory_fraction": FieldSpec("Memory fraction", 0.05, 1.0, 0.05, advanced=True),
    "memory_snapshot": FieldSpec("Memory snapshot", advanced=True),
    "max_grad_norm": FieldSpec("Clip gradients", 0.0, 1000.0, 0.1, advanced=True),
    "lora_alpha": FieldSpec("LoRA alpha", 0.1, 1024.0, 1.0, advanced=True),
    "patch_shape": FieldSpec("Patch", 1, 1024, 8, advanced=True),
    "seed": FieldSpec("Seed", 0, 2**31 - 1, 1, advanced=True),
}


def _number(value: float | None) -> str:
    """1000000 as "1000000", 1e-06 as "1e-06", 0.5 as "0.5"."""
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def field_docs(cls: type) -> dict[str, str]:
    """``{field: first sentence of its description}`` from a numpy-style docstring."""
    docs: dict[str, str] = {}
    lines = (cls.__doc__ or "").splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^\s{4}(\w+(?:, \w+)*) : ", line)
        if not match:
            continue
        text = []
        for follow in lines[i + 1 :]:
            if not follow.startswith(" " * 8):
                break
            text.append(follow.strip())
        sentence = " ".join(text).split(". ")[0].rstrip(".")
        for name in match.group(1).split(", "):
            docs[name] = sentence
    return docs
