"""Scores of instance labels against instance truth (benchmarks and tests).

Objects (mitochondria): matched one to one at IoU >= 0.5 -- above 0.5 a true
object can overlap at most one predicted object that much, so the matching is
unique without an assignment solver -- then precision, recall, F1 and the
count error. Regions (cells): scikit-image's adapted Rand error and variation
of information (split, merge), on the voxels the truth labels (its 0, the
membrane, has no cell to agree with).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage
from skimage.metrics import adapted_rand_error, variation_of_information

from napari_finetune.objects.roles import ChannelRole


def _check(pred: np.ndarray, true: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pred, true = np.asarray(pred), np.asarray(true)
    if pred.shape != true.shape:
        raise ValueError(f"labels {pred.shape} and truth {true.shape} differ in shape.")
    return pred, true


def matched_objects(pred: np.ndarray, true: np.ndarray, iou: float = 0.5) -> np.ndarray:
    """(true id, predicted id, IoU) rows of the pairs overlapping at more than ``iou``.

    ``iou`` must be >= 0.5: below, one object could match several and the pairs
    would need an assignment solver to be one to one.
    """
    if not 0.5 <= iou < 1.0:
        raise ValueError(f"iou must be in [0.5, 1), got {iou}.")
    pred, true = _check(pred, true)
    both = (pred > 0) & (true > 0)
    t, p = true[both].astype(np.int64), pred[both].astype(np.int64)
    pairs, inter = np.unique(np.stack([t, p]), axis=1, return_counts=True)
    true_size = np.bincount(true.ravel().astype(np.int64))
    pred_size = np.bincount(pred.ravel().astype(np.int64))
    union = true_size[pairs[0]] + pred_size[pairs[1]] - inter
    scores = inter / union
    keep = scores > iou
    return np.column_stack([pairs[0][keep], pairs[1][keep], scores[keep]])


def object_scores(pred: np.ndarray, true: np.ndarray, iou: float = 0.5) -> dict[str, float]:
    """Precision, recall, F1 of objects matched at IoU > ``iou``, and the count error.

    Returns
    -------
    dict
        ``precision``, ``recall``, ``f1``, ``n_pred``, ``n_true``, ``matched``,
        ``count_error`` (``(n_pred - n_true) / n_true``: +0.1 is 10 % too many).
    """
    pred, true = _check(pred, true)
    n_pred = int(np.unique(pred[pred > 0]).size)
    n_true = int(np.unique(true[true > 0]).size)
    tp = int(len(matched_objects(pred, true, iou)))
    precision = tp / n_pred if n_pred else float(n_true == 0)
    recall = tp / n_true if n_true else float(n_pred == 0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "n_pred": n_pred,
        "n_true": n_true,
        "matched": tp,
        "count_error": (n_pred - n_true) / n_true if n_true else float(n_pred),
    }


def region_scores(pred: np.ndarray, true: np.ndarray, min_size: int = 0) -> dict[str, float]:
    """Adapted Rand error and variation of information (split, merge) on the truth's regions.

    Voxels the truth leaves 0 (the boundary) are left out of both; a predicted 0
    inside a true region counts as one more predicted region (voxels the
    segmentation gave to no cell). ``n_true`` counts the true regions of at least
    ``min_size`` voxels (the objects step's, which drops smaller ones): a cell
    that shows one voxel between membranes is no cell a user counts (the sample's
    second volume: 70 of its 130 ids); ``n_true_any`` counts them all.
    """
    pred, true = _check(pred, true)
    inside = true > 0
    p, t = pred[inside], true[inside]
    are, _, _ = adapted_rand_error(t, p, ignore_labels=())
    # skimage returns (H(pred | true), H(true | pred)): the first grows when the
    # segmentation splits a true region, the second when it merges two.
    split, merge = variation_of_information(t, p, ignore_labels=())
    return {
        "adapted_rand_error": float(are),
        "voi_split": float(split),
        "voi_merge": float(merge),
        "n_pred": int(np.unique(p[p > 0]).size),
        "n_true": int((np.bincount(t.astype(np.int64))[1:] >= max(min_size, 1)).sum()),
        "n_true_any": int(np.unique(t).size),
    }


def scores_by_role(
    found: dict[str, np.ndarray],
    roles: dict[str, ChannelRole],
    channel_names: list[str] | tuple[str, ...],
    cells: np.ndarray | None,
    semantic: np.ndarray,
) -> dict[str, dict[str, float]]:
    """Each channel's objects scored against the truth, by its role.

    A boundary channel's regions against the cell truth (:func:`region_scores`:
    adapted Rand error on the truth's cells, its 0 left out, and VOI split /
    merge apart); an object channel's objects against the connected blobs of
    its class in the semantic truth, the objects the image shows (class =
    channel index + 1; :func:`object_scores`). This is how a volume nobody
    painted is scored: the caller cuts every array to the voxels to score.

    Parameters
    ----------
    found : channel name -> instance labels
        (:func:`napari_finetune.objects.instances_of`).
    roles : channel name -> ChannelRole
    channel_names : the channel names, in channel order.
    cells : instance truth of the cells, or None (then boundary channels get no score).
    semantic : semantic truth, 0 background and c + 1 for channel c.

    Returns
    -------
    dict
        Channel name -> its scores, for the channels in ``found`` that can be scored.
    """
    out: dict[str, dict[str, float]] = {}
    for c, name in enumerate(channel_names):
        if name not in found:
            continue
        role = roles[name].role
        if role == "boundary" and cells is not None:
            out[name] = region_scores(found[name], cells, roles[name].min_size)
        elif role == "object":
            blobs, _ = ndimage.label(np.asarray(semantic) == c + 1)
            out[name] = object_scores(found[name], blobs)
    return out
