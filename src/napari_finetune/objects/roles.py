"""What each output channel means for instances, stored in a checkpoint's metadata.

``metadata["instance_roles"] = {channel_name: {"role": ..., "threshold": ..., ...}}``
holds plain Python types only, so a checkpoint still loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

METADATA_KEY = "instance_roles"
# Where each estimated parameter came from: {channel: {"seed_distance": "set by you", ...}}
# (:mod:`napari_finetune.objects.from_painting`), beside the roles, plain strings.
SOURCES_KEY = "instance_roles_source"
ROLES = ("boundary", "object")

# The sample model's channels (napari_finetune.samples.synthetic_em.CHANNEL_NAMES;
# that module sits on a higher floor, so the names are repeated and a test keeps them equal).
SAMPLE_CHANNELS = ("membrane", "mitochondria")


@dataclass(frozen=True)
class ChannelRole:
    """How one channel's probability becomes instance labels.

    Parameters
    ----------
    role : {"boundary", "object"} or None
        ``"boundary"``: the channel is high between regions (membranes) and the
        regions it encloses are the instances. ``"object"``: the channel is high
        on the instances. ``None``: no instances from this channel.
    threshold : float
        In (0, 1). Boundary: voxels below it are interior. Object: voxels above
        it are foreground.
    min_size : int
        Instances smaller than this many voxels are removed (set to 0).
    seed_distance : float
        Voxels, >= 1. Boundary: a seed is a maximum of the interior's depth at
        least this far from the boundary, standing at least half of it (and 2
        voxels) above the saddle to any deeper maximum (h-maxima): a gap in the
        boundary shallower than the cells' middles by that much merges no
        cells, and a cell's bumps lower than that give it no second seed;
        cells must be wider than twice it to get a seed.
        Object: the smallest distance between two seeds when touching objects
        are split. With ``seed_threshold`` it leaves the labels of one piece
        alone and sets only the blockwise halo, 4x it (the sample's 4: 16
        voxels): objects reaching less than that past a block border are
        cut exactly as in one piece, a longer one may be cut from what one
        block sees (:func:`napari_finetune.objects.blockwise.default_halo`).
    split : bool
        Object role only: split touching objects (a watershed); off, each
        connected component is one object. The seeds are the distance
        transform's maxima, or with ``seed_threshold`` the probability's cores.
    seed_threshold : float or None
        Object role with ``split`` only; in (``threshold``, 1). Seeds are the
        connected cores where the probability is above it, and objects joined
        by a weaker bridge are cut where the probability is lowest between
        them (instead of at the narrowest place, which cuts a long or bent
        object in pieces). None: the distance-transform seeds.
    """

    role: str | None = None
    threshold: float = 0.5
    min_size: int = 0
    seed_distance: float = 1.0
    split: bool = False
    seed_threshold: float | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, channel: str = "?") -> None:
        """Raise a one-line ValueError naming the fix for a value that cannot work."""
        where = f"instance role of channel {channel!r}"
        if self.role is not None and self.role not in ROLES:
            raise ValueError(f"{where}: unknown role {self.role!r}; use one of {ROLES} or None.")
        if not (isinstance(self.threshold, int | float) and 0.0 < self.threshold < 1.0):
            raise ValueError(
                f"{where}: threshold must be in (0, 1), got {self.threshold!r}; 0.5 is the usual."
            )
        size = self.min_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(
                f"{where}: min_size must be a whole number of voxels >= 0, got {self.min_size!r}."
            )
        d = self.seed_distance
        # Below one voxel every voxel is its own distance-transform maximum: a seed each.
        if not (isinstance(d, int | float) and math.isfinite(d) and d >= 1.0):
            raise ValueError(
                f"{where}: seed_distance must be >= 1 voxel (below, every voxel is a seed), "
                f"got {d!r}."
            )
        seed = self.seed_threshold
        if seed is not None and not (
            isinstance(seed, int | float)
            and not isinstance(seed, bool)
            and self.threshold < seed < 1.0
        ):
            raise ValueError(
                f"{where}: seed_threshold must be None or in (threshold, 1) = "
                f"({self.threshold!r}, 1), got {seed!r}; cores must be surer than the foreground."
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, for a checkpoint's metadata."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], channel: str = "?") -> ChannelRole:
        """The role a metadata entry describes; unknown keys are an error, not ignored."""
        if not isinstance(values, dict):
            raise ValueError(
                f"instance role of channel {channel!r} must be a dict like "
                f"{{'role': 'object', 'threshold': 0.5}}, got {values!r}."
            )
        known = {f.name for f in fields(cls)}
        extra = sorted(set(values) - known)
        if extra:
            raise ValueError(
                f"instance role of channel {channel!r}: unknown keys {extra}; use {sorted(known)}."
            )
        role = cls.__new__(cls)  # validated below with the channel's name in the message
        defaults = asdict(cls())
        for name in known:
            object.__setattr__(role, name, values.get(name, defaults[name]))
        role.validate(channel)
        return role


# Chosen by measurement on the sample (benchmarks/bench_instances.py). The membrane's
# threshold and seed distance were chosen on one volume (the sample's own, target seed 1)
# and scored on others nobody tuned on (docs/benchmarks.md, "Objects that generalise").
SAMPLE_ROLES = {
    "membrane": ChannelRole("boundary", threshold=0.5, min_size=200, seed_distance=8.0),
    "mitochondria": ChannelRole(
        "object", threshold=0.4, min_size=200, seed_distance=4.0, split=True, seed_threshold=0.9
    ),
}


def roles_from_metadata(
    metadata: dict[str, Any], channel_names: list[str] | tuple[str, ...]
) -> dict[str, ChannelRole]:
    """One :class:`ChannelRole` per channel name, from ``metadata[METADATA_KEY]``.

    Channels the metadata does not mention have role ``None``. Without the key,
    the sample model's channels get :data:`SAMPLE_ROLES` (membrane a boundary,
    mitochondria an object) and any other model none.
    """
    names = [str(n) for n in channel_names]
    stored = metadata.get(METADATA_KEY)
    if stored is None:
        if tuple(names) == SAMPLE_CHANNELS:
            return dict(SAMPLE_ROLES)
        return {n: ChannelRole() for n in names}
    if not isinstance(stored, dict):
        raise ValueError(
            f"metadata[{METADATA_KEY!r}] must map channel names to roles, "
            f"got {type(stored).__name__}."
        )
    unknown = sorted(set(stored) - set(names))
    if unknown:
        raise ValueError(
            f"metadata[{METADATA_KEY!r}] names channels {unknown} the model does not have; "
            f"its channels are {names}."
        )
    return {n: ChannelRole.from_dict(stored[n], n) if n in stored else ChannelRole() for n in names}


def roles_to_metadata(
    roles: dict[str, ChannelRole], metadata: dict[str, Any],
    sources: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """A copy of ``metadata`` with ``roles`` under :data:`METADATA_KEY` (channels with a role)
    and, when given, where their parameters came from under :data:`SOURCES_KEY`."""
    out = dict(metadata)
    for name, role in roles.items():
        role.validate(name)
    out[METADATA_KEY] = {name: role.to_dict() for name, role in roles.items() if role.role}
    out.pop(SOURCES_KEY, None)  # the sources of other roles say nothing of these
    if sources:
        out[SOURCES_KEY] = {channel: {str(k): str(v) for k, v in per.items()}
                            for channel, per in sources.items() if channel in out[METADATA_KEY]}
    return out


def sources_from_metadata(metadata: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Where the stored roles' parameters came from (:data:`SOURCES_KEY`); {} when unsaid."""
    stored = metadata.get(SOURCES_KEY)
    if not isinstance(stored, Mapping):
        return {}
    return {str(channel): {str(k): str(v) for k, v in per.items()}
            for channel, per in stored.items() if isinstance(per, Mapping)}
