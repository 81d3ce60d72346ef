"""The sample volumes as OME-Zarr stores in a cache folder, generated on first use.

A store is written under a temporary name next to its final place and renamed
when complete, and it carries a completion record in its root attributes; a
store without that record (an interrupted copy, an old layout) is regenerated.
Two processes asking at once each generate, and the first rename wins.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from napari_finetune.samples import synthetic_em as gen

logger = logging.getLogger(__name__)

COMPLETE_KEY = "napari_finetune_sample"
# Part of the completion record: a cached store of an older layout (layout 1: a labels
# group without its NGFF version; layout 2: no instance labels) no longer matches and
# is written again.
STORE_LAYOUT = 3
CHUNKS = (32, 128, 128)
# The sample's store is written this long after its layers were returned (see
# sample_in_memory); whoever needs it sooner waits for it (io/pending.py).
WRITE_DELAY_S = 3.0


def store_name(domain: str, shape: tuple[int, int, int], seed: int) -> str:
    """File name that keys the cache: generator version, domain, seed and shape."""
    z, y, x = shape
    return f"synthetic-em_v{gen.GENERATOR_VERSION}_{domain}_seed{seed}_{z}x{y}x{x}.ome.zarr"


def _record(domain: str, shape: tuple[int, int, int], seed: int) -> dict[str, Any]:
    return {
        "generator_version": gen.GENERATOR_VERSION,
        "store_layout": STORE_LAYOUT,
        "domain": domain,
        "seed": int(seed),
        "shape": [int(s) for s in shape],
        "channel_names": list(gen.CHANNEL_NAMES),
        "ground_truth": "labels/ground_truth: 0 background, 1 membrane, 2 mitochondria",
        "instance_labels": [f"labels/ground_truth_{name}" for name in gen.INSTANCE_CLASSES],
    }


def is_complete(path: Path, record: dict[str, Any] | None = None) -> bool:
    """True when ``path`` is a finished sample store (with the expected record, if given)."""
    import zarr

    try:
        attrs = zarr.open_group(str(path), mode="r").attrs.asdict()
    except Exception:  # missing, half-written or not zarr at all
        return False
    found = attrs.get(COMPLETE_KEY)
    return found is not None and (record is None or found == record)


def _scale_factors(shape: tuple[int, int, int]) -> tuple[int, ...]:
    # ome-zarr downsamples y and x; stop before a level gets smaller than 16.
    factors: list[int] = []
    factor = 2
    while len(factors) < 3 and min(shape[1:]) // factor >= 16:
        factors.append(factor)
        factor *= 2
    return tuple(factors)


# z-slices halved per piece of the pyramid's downsampling: a 256 x 256 slab of this many
# slices takes about a millisecond, and the writer yields the GIL after each (see _halve_yx).
SLAB_Z = 4


def _halve_yx(level: np.ndarray) -> np.ndarray:
    """``level`` at half its y and x size: the rounded mean of each 2 x 2 block.

    The same shape as ome-zarr's own levels (``size // 2``), and what a user sees
    zoomed out. Computed a few z-slices at a time with a yield between them: the
    writer runs beside napari (:func:`sample_in_memory`), and ome-zarr's own
    downsampling (scikit-image's ``resize`` with a Gaussian over whole blocks) held
    the GIL for 0.7 s at a time.
    """
    z, y, x = level.shape
    h, w = y // 2, x // 2
    out = np.empty((z, h, w), dtype=level.dtype)
    for start in range(0, z, SLAB_Z):
        part = level[start:start + SLAB_Z, :2 * h, :2 * w].astype(np.float32)
        mean = 0.25 * (part[:, 0::2, 0::2] + part[:, 1::2, 0::2]
                       + part[:, 0::2, 1::2] + part[:, 1::2, 1::2])
        if np.issubdtype(level.dtype, np.integer):
            mean = np.rint(mean)
        out[start:start + SLAB_Z] = mean
        time.sleep(0)  # hands the GIL over: napari's main thread waits for it otherwise
    return out


def pyramid(image: np.ndarray, levels: int) -> list[np.ndarray]:
    """``image`` and ``levels`` levels below it, each half the y and x size of the last."""
    out = [image]
    for _ in range(levels):
        out.append(_halve_yx(out[-1]))
    return out


def write_store(
    path: str | os.PathLike,
    image: np.ndarray,
    truth: np.ndarray,
    record: dict[str, Any],
    instances: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write ``image`` (multiscale) and ``labels/ground_truth`` as OME-Zarr at ``path``.

    ``instances`` (class name -> uint32 ids, from ``generate_volume(...,
    instances=True)``) go to ``labels/ground_truth_<name>``.
    """
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_multiscale

    from napari_finetune import palette
    from napari_finetune.io.labels import write_labels

    path = Path(path)
    root = zarr.group(store=parse_url(str(path), mode="w").store)
    chunks = tuple(min(c, s) for c, s in zip(CHUNKS, image.shape, strict=True))
    # The levels computed here (pyramid), not by ome-zarr: see _halve_yx.
    levels = pyramid(image, len(_scale_factors(image.shape)))
    write_multiscale(
        levels, root, axes="zyx", name="synthetic-em", storage_options={"chunks": chunks},
    )
    # Ground truth value k + 1 is channel k: the palette's colour of that channel.
    colors = [
        {"label-value": k + 1, "rgba": palette.rgba(color)}
        for k, color in enumerate(palette.default_colors(len(gen.CHANNEL_NAMES)))
    ]
    properties = [
        {"label-value": k + 1, "class": name} for k, name in enumerate(gen.CHANNEL_NAMES)
    ]
    # Our own writer, not ome-zarr-py's: its labels group has no NGFF version, which
    # ome-zarr-models rejects; ours copies the image's levels and transforms exactly.
    write_labels(path, "ground_truth", truth, colors=colors, properties=properties)
    for name, ids in (instances or {}).items():
        write_labels(path, f"ground_truth_{name}", ids, dtype=np.uint32)
    # Written last: its presence is what "complete" means.
    root.attrs[COMPLETE_KEY] = record
    return path


def ensure_sample(
    domain: str = "target",
    shape: tuple[int, int, int] = gen.DEFAULT_SHAPE,
    seed: int | None = None,
) -> Path:
    """Path of the sample OME-Zarr store, generated into the cache folder on first use.

    The cache folder is :func:`~napari_finetune.samples.synthetic_em.cache_dir`.
    The store holds the uint8 image as a multiscale pyramid and the ground truth
    in ``labels/ground_truth`` (0 background, 1 membrane, 2 mitochondria), the
    instance truth in ``labels/ground_truth_cells`` and
    ``labels/ground_truth_mitochondria`` (uint32 ids, see
    :func:`~napari_finetune.samples.synthetic_em.generate_volume`). It is
    keyed by generator version, domain, seed and shape, written to a temporary
    folder and renamed when complete, so an interrupted run never leaves a store
    that looks finished.

    Parameters
    ----------
    domain : {"source", "target"}
    shape : (z, y, x)
    seed : int, optional
        Defaults to ``DEFAULT_SEEDS[domain]``.
    """
    final, record = _place(domain, shape, seed)
    if is_complete(final, record):
        return final
    image, truth, instances = _generate(domain, record)
    return _write_final(final, record, image, truth, instances)


def _place(
    domain: str, shape: tuple[int, int, int], seed: int | None,
) -> tuple[Path, dict[str, Any]]:
    """The store's final path in the cache folder and its completion record."""
    shape = gen._check(shape, domain)
    seed = gen.DEFAULT_SEEDS[domain] if seed is None else int(seed)
    return gen.cache_dir() / store_name(domain, shape, seed), _record(domain, shape, seed)


def _generate(
    domain: str, record: dict[str, Any],
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    from napari_finetune.samples import shipped

    # The default sample is shipped as drawn: reading it is ~100 times faster than drawing.
    found = shipped.read(record, instances=True)
    if found is not None:
        return found
    shape = tuple(int(n) for n in record["shape"])
    return gen.generate_volume((shape[0], shape[1], shape[2]), record["seed"], domain,
                               instances=True)


def _write_final(
    final: Path, record: dict[str, Any], image: np.ndarray, truth: np.ndarray,
    instances: dict[str, np.ndarray],
) -> Path:
    """Write the store under a temporary name beside ``final``, then rename it there."""
    folder = final.parent
    folder.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(folder, final.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=folder))
    try:
        write_store(tmp / "store.zarr", image, truth, record, instances)
        if final.exists() and not is_complete(final, record):
            shutil.rmtree(final)  # a half or stale store from an earlier crash
        try:
            os.replace(tmp / "store.zarr", final)
        except OSError:
            if not is_complete(final, record):  # not a concurrent winner: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def looks_complete(path: Path, record: dict[str, Any]) -> bool:
    """:func:`is_complete` read from the root's JSON alone, without importing zarr (0.3 s
    or more on the main thread, where the napari sample asks)."""
    for name, inside in (("zarr.json", "attributes"), (".zattrs", None)):
        try:
            attrs = json.loads((path / name).read_text())
        except (OSError, ValueError):
            continue
        if inside is not None:
            attrs = attrs.get(inside) or {}
        return isinstance(attrs, dict) and attrs.get(COMPLETE_KEY) == record
    return False


def sample_in_memory(
    domain: str = "target",
    shape: tuple[int, int, int] = gen.DEFAULT_SHAPE,
    seed: int | None = None,
) -> tuple[Path, np.ndarray, np.ndarray] | Path:
    """The sample for a caller that must not wait for its store (napari's main thread).

    Returns the store's path when the cache holds it complete; else the volume
    and its truth in memory (the shipped one, :mod:`~napari_finetune.samples.
    shipped`, or generated), with the path the store will have: it is
    written there by a background thread, announced to
    :mod:`napari_finetune.io.pending`, so whoever reads or writes it first
    (an autosave, a run) waits for it there, in a job's thread.
    """
    final, record = _place(domain, shape, seed)
    if looks_complete(final, record):
        return final
    from napari_finetune.io.pending import announce, is_pending
    from napari_finetune.samples import shipped

    found = shipped.read(record)  # without its instances: the layers do not show them
    if found is not None:
        image, truth, _ = found

        def arrays() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
            return _generate(domain, record)  # the shipped file again, in the writer's thread
    else:
        drawn = _generate(domain, record)
        image, truth = drawn[0], drawn[1]

        def arrays() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
            return drawn
    if not is_pending(final):  # opened twice at once: the first write serves both
        ended = announce(final)

        def write() -> None:
            failure: BaseException | None = None
            try:
                _write_final(final, record, *arrays())
            except BaseException as exc:  # handed to whoever waits for the store
                logger.warning("the sample store %s could not be written: %s", final, exc)
                failure = exc
            ended(failure)

        # Started a moment later: napari's first image layer imports modules (dask among
        # them) that the writer's imports of zarr and ome-zarr hold the import locks of,
        # and both share the GIL; the opening took 7.0 s with the writer at once, 5.1 s
        # without it (2 loaded cores). A daemon: a store cut short by the app's exit is a
        # temporary, removed later.
        timer = threading.Timer(WRITE_DELAY_S, write)
        timer.name, timer.daemon = "napari-finetune sample store", True
        timer.start()
    return final, image, truth


def _remove_stale_temporaries(folder: Path, name: str, age_s: float = 3600.0) -> None:
    # A killed process (SIGKILL, power cut) cannot clean up after itself; an
    # hour-old temporary is no longer being written by anyone.
    for tmp in folder.glob(f".{name}.*.tmp"):
        try:
            if time.time() - tmp.stat().st_mtime > age_s:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError as exc:  # gone meanwhile, or not ours to remove
            logger.debug("stale temporary %s left in place: %s", tmp, exc)
