"""From per-channel probabilities to objects: cells, mitochondria, nuclei...

A channel plays a *role* (:mod:`.roles`): a ``"boundary"`` channel encloses
regions (membranes around cells), an ``"object"`` channel covers the objects
themselves (mitochondria). :mod:`.segment` turns one probability map into
uint32 instance labels by its role, :mod:`.blockwise` a whole volume block by
block with one id per object; :mod:`.scores` measures them against
instance truth. Only numpy, scipy and scikit-image are imported: this runs on a
headless worker as well as under napari.
"""

from napari_finetune.objects.blockwise import blockwise_instances
from napari_finetune.objects.from_painting import RolesFromPainting, roles_from_painting
from napari_finetune.objects.roles import (
    METADATA_KEY,
    ROLES,
    SOURCES_KEY,
    ChannelRole,
    roles_from_metadata,
    roles_to_metadata,
    sources_from_metadata,
)
from napari_finetune.objects.segment import boundary_instances, instances_of, object_instances

__all__ = [
    "METADATA_KEY",
    "ROLES",
    "SOURCES_KEY",
    "ChannelRole",
    "RolesFromPainting",
    "blockwise_instances",
    "boundary_instances",
    "instances_of",
    "object_instances",
    "roles_from_metadata",
    "roles_from_painting",
    "roles_to_metadata",
    "sources_from_metadata",
]
