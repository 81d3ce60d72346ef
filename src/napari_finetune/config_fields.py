"""How a person sets each :class:`~napari_finetune.config.FinetuneConfig` field: one place.

The CLI (``cli/options.py``) checks its options against these ranges and the
widget's settings form (``_qt/settings.py``) builds its inputs from them, so
the two cannot disagree; the help text and the tooltips both come from the
field's entry in ``FinetuneConfig``'s docstring (:func:`field_docs`), in plain
words: no markup, and a field named in it is said the way the front end names it.
Plain Python, no Qt.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass

DEVICES = ("auto", "cpu", "cuda", "mps")
# Every name a device setting takes, as a person reads them (cuda:N: the GPU of index N).
DEVICE_NAMES = ("auto", "cpu", "cuda", "cuda:N", "mps")
_DEVICE_NAME = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def is_device_name(name: str) -> bool:
    """Whether ``name`` is one of :data:`DEVICE_NAMES` ("cuda:1" is; "gpu", "cpu:0" are not)."""
    return bool(_DEVICE_NAME.match(name))


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


def field_docs(cls: type, refer: Callable[[str], str] | None = None) -> dict[str, str]:
    """``{field: first sentence of its description}`` from a numpy-style docstring, in plain words.

    The reST markup a docstring uses is dropped: ````x```` reads x and ``:class:`X``` reads X.
    A field of ``cls`` named in double backticks reads ``refer(name)``: the CLI passes its
    option's name (``--cpu-bf16``); by default it is said in words ("cpu bf16").

    Raises
    ------
    ValueError
        An entry documents several fields at once (``a, b : int``): each field's option
        and tooltip needs its own text, so give each its own entry.
    """
    say = refer or (lambda name: name.replace("_", " "))
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()

    def plain(match: re.Match[str]) -> str:
        literal, role = match.group("literal"), match.group("role")
        if literal is not None:
            return say(literal) if literal in names else literal
        return role.rsplit(".", 1)[-1] if role.startswith("~") else role

    docs: dict[str, str] = {}
    # Dedented as Python 3.13 stores it already: an entry at column 0, its text under it.
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^(\w+(?:\s*,\s*\w+)*) : ", line)
        if not match:
            continue
        if "," in match.group(1):
            raise ValueError(
                f"{cls.__name__}'s docstring documents {match.group(1)} in one entry; give "
                "each field its own, so that each option and tooltip says what it does."
            )
        text = []
        for follow in lines[i + 1 :]:
            if not follow.startswith(" " * 4):
                break
            text.append(follow.strip())
        sentence = " ".join(text).split(". ")[0].rstrip(".")
        docs[match.group(1)] = _MARKUP.sub(plain, sentence)
    return docs


# ``literal`` and :role:`target` (a role's ~ shows only the target's last part).
_MARKUP = re.compile(r"``(?P<literal>.+?)``|:\w+:`(?P<role>[^`]+)`")
