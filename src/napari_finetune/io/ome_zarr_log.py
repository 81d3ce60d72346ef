"""ome-zarr-py's notices while we read a store: to our debug log, not napari's console.

ome-zarr-py's ``Reader`` logs (does not raise) what it can live with, such as
labels without a ``source``, at INFO or WARNING. Raising the level of the
``ome_zarr`` logger around the read would change it for every thread (a worker
restoring the old level could undo another's) and for the user's own ome-zarr
calls. Instead a filter on ome-zarr-py's loggers, added once when this module
is imported, lets every record through except those below ERROR that the
current thread emits inside :func:`quiet_ome_zarr`; those go to this module's
logger at DEBUG, so they are still there for whoever turns it on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)
# The loggers ome-zarr-py's Reader path writes to (a filter on a parent logger
# does not see its children's records).
OME_ZARR_LOGGERS = ("ome_zarr.reader", "ome_zarr.io", "ome_zarr.format")
_reading = threading.local()


class _QuietWhileReading(logging.Filter):
    """Drops this thread's sub-ERROR ome-zarr records inside :func:`quiet_ome_zarr`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(_reading, "depth", 0) and record.levelno < logging.ERROR:
            logger.debug("ome-zarr %s: %s", record.levelname.lower(), record.getMessage())
            return False
        return True


_FILTER = _QuietWhileReading()
for _name in OME_ZARR_LOGGERS:
    logging.getLogger(_name).addFilter(_FILTER)  # once: addFilter ignores a repeat


@contextmanager
def quiet_ome_zarr() -> Iterator[None]:
    """Within the block, this thread's ome-zarr notices go to the debug log only."""
    _reading.depth = getattr(_reading, "depth", 0) + 1
    try:
        yield
    finally:
        _reading.depth -= 1
