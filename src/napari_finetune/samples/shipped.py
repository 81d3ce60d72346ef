"""The napari sample's volume, drawn once and shipped in the package.

``viewer.open_sample("napari-finetune", "synthetic-em")`` must return its
layers, so whatever makes the volume runs on napari's main thread. Drawing
the default target volume (64 x 256 x 256) takes 2-3 s there, and importing
scipy for it 0.3-0.8 s more; reading the same arrays back from this package's
``synthetic_em_target.npz`` (4 MB) takes ~30 ms. The file holds exactly what
:func:`~napari_finetune.samples.synthetic_em.generate_volume` returns for that
sample (``tests/samples/test_shipped.py`` draws it again and compares), with a
key of generator version, domain, seed and shape: another shape or seed, or a
generator whose version moved on, finds no match and is drawn as before.

Write the file again after changing the generator::

    python -m napari_finetune.samples.shipped
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from napari_finetune.samples import synthetic_em as gen

FILE = Path(__file__).with_name("synthetic_em_target.npz")
# The one sample shipped: the one napari's File > Open Sample gives by default.
DOMAIN = "target"

Arrays = tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]


def key(domain: str, shape: tuple[int, int, int], seed: int) -> np.ndarray:
    """What the arrays were drawn from: generator version, domain, seed, shape."""
    return np.array([gen.GENERATOR_VERSION, gen.DOMAINS.index(domain), seed, *shape], np.int64)


def read(record: dict[str, Any], instances: bool = False, path: Path = FILE) -> Arrays | None:
    """The shipped image and truth (and instances, on request) for a store's ``record``.

    Parameters
    ----------
    record : dict
        A sample store's completion record (``domain``, ``seed``, ``shape``,
        ``generator_version``; :func:`napari_finetune.samples.store._record`).
    instances : bool
        Also read the instance arrays (another ~30 ms; the background writer
        wants them, the layers do not).
    path : Path
        The shipped file.

    Returns
    -------
    (image, truth, instances) or None
        ``instances`` maps each of :data:`~napari_finetune.samples.synthetic_em.
        INSTANCE_CLASSES` to its ids, empty unless asked for. None when the file
        is missing (a source checkout without it) or holds another volume.
    """
    if record.get("domain") != DOMAIN or record.get("generator_version") != gen.GENERATOR_VERSION:
        return None
    shape = tuple(int(n) for n in record["shape"])
    if len(shape) != 3:
        return None
    wanted = key(DOMAIN, (shape[0], shape[1], shape[2]), int(record["seed"]))
    try:
        with np.load(path, allow_pickle=False) as data:
            if not np.array_equal(data["key"], wanted):
                return None
            image, truth = data["image"], data["truth"]
            ids = {name: data[name] for name in gen.INSTANCE_CLASSES} if instances else {}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None  # absent or damaged: drawing it is slower, never wrong
    return image, truth, ids


def write(path: Path = FILE) -> Path:
    """Draw the default sample (with its instances) and save it, compressed, at ``path``."""
    shape = gen.DEFAULT_SHAPE
    seed = gen.DEFAULT_SEEDS[DOMAIN]
    image, truth, ids = gen.generate_volume(shape, seed, DOMAIN, instances=True)
    # By name, not ``**ids``: numpy's stubs read a dict of arrays as its keyword flags too.
    # A renamed instance class fails here; an added one would be missing from the file,
    # which read() then declines (tests/samples/test_shipped.py says so).
    cells, mitochondria = (ids[name] for name in ("cells", "mitochondria"))
    np.savez_compressed(path, key=key(DOMAIN, shape, seed), image=image, truth=truth,
                        cells=cells, mitochondria=mitochondria)
    return path


if __name__ == "__main__":
    print(write())
