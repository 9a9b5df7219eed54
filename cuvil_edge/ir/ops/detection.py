"""Object-detection post-processing, the op contract's one-row form (``_contract.py``):
NonMaxSuppression. Per batch and class, boxes above ``score_threshold`` are taken by descending
score (ties: lower index first) and kept unless their IoU with a kept box exceeds
``iou_threshold``, up to ``max_output_boxes_per_class``. The number of rows depends on the data,
so the output's length is a symbol of its own.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._util import INT, data_dependent_dim, need


def _nms_overlaps(boxes, center_point_box, iou_threshold):
    """(boxes, boxes) bool: whether the pair overlaps by more than ``iou_threshold``."""
    if center_point_box:
        x1, x2 = boxes[:, 0] - boxes[:, 2] / 2, boxes[:, 0] + boxes[:, 2] / 2
        y1, y2 = boxes[:, 1] - boxes[:, 3] / 2, boxes[:, 1] + boxes[:, 3] / 2
    else:  # [y1, x1, y2, x2], either corner first
        x1, x2 = np.minimum(boxes[:, 1], boxes[:, 3]), np.maximum(boxes[:, 1], boxes[:, 3])
        y1, y2 = np.minimum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 0], boxes[:, 2])
    wide = np.minimum(x2[:, None], x2[None]) - np.maximum(x1[:, None], x1[None])
    high = np.minimum(y2[:, None], y2[None]) - np.maximum(y1[:, None], y1[None])
    inter = np.where((wide > 0) & (high > 0), wide * high, 0)
    area = (x2 - x1) * (y2 - y1)
    union = area[:, None] + area[None] - inter
    valid = (inter > 0) & (area[:, None] > 0) & (area[None] > 0) & (union > 0)
    return valid & (inter / np.where(valid, union, 1) > iou_threshold)


def k_non_max_suppression(
    boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None, *, center_point_box
):
    given = max_output_boxes_per_class is not None and max_output_boxes_per_class.size > 0
    limit = max(int(max_output_boxes_per_class.reshape(-1)[0]), 0) if given else 0
    iou = float(iou_threshold.reshape(-1)[0]) if iou_threshold is not None and iou_threshold.size else 0.0
    rows = []
    for b in range(boxes.shape[0]):
        overlaps = _nms_overlaps(boxes[b], center_point_box, iou)
        for c in range(scores.shape[1]):
            s = scores[b, c]
            order = np.argsort(-s, kind="stable")
            if score_threshold is not None and score_threshold.size:
                order = order[s[order] > score_threshold.reshape(-1)[0]]
            kept = []
            for i in order:
                if len(kept) >= limit:
                    break
                if not overlaps[i, kept].any():
                    kept.append(int(i))
                    rows.append((b, c, int(i)))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def _infer_nms(node, inputs):
    need(node, inputs, 2, 3)
    boxes, scores = inputs[:2]
    if boxes.dtype != "float32" or scores.dtype != "float32":
        raise ShapeInferenceError(f"{node.describe()}: boxes and scores must be float32, got {boxes}, {scores}")
    if (
        boxes.rank != 3
        or boxes.shape[2] != 4
        or scores.rank != 3
        or (isinstance(boxes.shape[1], int) and isinstance(scores.shape[2], int) and boxes.shape[1] != scores.shape[2])
    ):
        raise ShapeInferenceError(
            f"{node.describe()}: boxes must be [batch, boxes, 4] and scores [batch, classes, boxes], "
            f"got {boxes}, {scores}"
        )
    for t, (what, dtype) in zip(
        inputs[2:],
        (("max_output_boxes_per_class", "int64"), ("iou_threshold", "float32"), ("score_threshold", "float32")),
        strict=False,
    ):
        if t is not None and (t.dtype != dtype or t.rank > 1):
            raise ShapeInferenceError(f"{node.describe()}: {what} must be a {dtype} scalar, got {t}")
    return [TensorType("int64", (data_dependent_dim(node), 3))]


def _nms_flops(node, inputs, outputs):
    boxes = inputs[0].shape[1] if isinstance(inputs[0].shape[1], int) else 1
    return 12 * boxes * boxes * inputs[0].numel() // max(boxes * 4, 1) + 4 * inputs[1].numel()


OPS = (
    OpDef(
        "NonMaxSuppression",
        (10, 11),
        infer=_infer_nms,
        fn=k_non_max_suppression,
        flops=_nms_flops,
        attrs=lambda node: {"center_point_box": int(node.attr("center_point_box", 0))},
        helpers=(_nms_overlaps,),
        ATTRS={"center_point_box": INT},
    ),
)
