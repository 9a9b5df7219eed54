"""TfIdfVectorizer (opset 9), the op contract's one-row form (``_contract.py``), over integer
token ids (the IR has no strings): counts of the pool's n-grams in each row, with up to
``max_skip_count`` tokens skipped between an n-gram's items (unigrams are counted once), weighted
as TF, IDF or TFIDF (the i-th weight belongs to the pool's i-th n-gram, as the spec says and
onnxruntime does). ``attrs`` turns the pool into (n-gram, output index) pairs once.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._util import FLOATS, INT, INTS, STR, choice, ints, need


def k_tf_idf_vectorizer(x, grams, min_n, max_n, max_skip, mode, weights, size):
    table = dict(grams)
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    counts = np.zeros((rows.shape[0], size), np.float32)
    for r in range(rows.shape[0]):
        tokens = rows[r].tolist()
        for distance in range(1, max_skip + 2):
            for n in range(max(min_n, 2) if distance > 1 else min_n, max_n + 1):
                for i in range(len(tokens) - (n - 1) * distance):
                    k = table.get(tuple(tokens[i : i + (n - 1) * distance + 1 : distance]))
                    if k is not None:
                        counts[r, k] += 1
    w = np.ones(size, np.float32) if weights is None else np.array(weights, np.float32)
    if mode == "IDF":
        out = np.where(counts > 0, w, np.float32(0))
    elif mode == "TFIDF":
        out = counts * w
    else:
        out = counts
    return out.reshape(size) if x.ndim == 1 else out


def _tfidf_attrs(node):
    if node.attr("pool_strings"):
        raise UnsupportedAttributeError(
            f"{node.describe()}: string pools are unsupported (the IR has no strings); "
            "map tokens to integer ids and use pool_int64s"
        )
    pool, starts, indexes = ints(node, "pool_int64s"), ints(node, "ngram_counts"), ints(node, "ngram_indexes")
    missing = [
        key for key in ("min_gram_length", "max_gram_length", "max_skip_count", "mode") if node.attr(key) is None
    ]
    if missing:
        raise UnsupportedAttributeError(f"{node.describe()}: the required attributes {missing} are missing")
    min_n, max_n = int(node.attr("min_gram_length")), int(node.attr("max_gram_length"))
    if not indexes or not 1 <= min_n <= max_n or len(starts) < 1:
        raise UnsupportedAttributeError(
            f"{node.describe()}: needs ngram_indexes and 1 <= min_gram_length <= max_gram_length, got {min_n}, {max_n}"
        )
    if starts[0] != 0 or any(b < a for a, b in zip(starts, starts[1:], strict=False)) or starts[-1] > len(pool):
        raise UnsupportedAttributeError(
            f"{node.describe()}: ngram_counts {starts} must start at 0 and rise to at most "
            f"the pool's {len(pool)} entries"
        )
    grams, ngram_id = [], 0
    for i, start in enumerate(starts):  # section i holds the n-grams of length i + 1
        end = starts[i + 1] if i + 1 < len(starts) else len(pool)
        n = i + 1
        for j in range(start, end, n):
            if min_n <= n <= max_n:
                if ngram_id >= len(indexes):
                    raise UnsupportedAttributeError(f"{node.describe()}: ngram_indexes has fewer entries than the pool")
                grams.append((tuple(pool[j : j + n]), indexes[ngram_id]))
            ngram_id += 1
    given = node.attr("weights")
    weights = None
    if given:  # the i-th weight belongs to the i-th n-gram of the pool (as onnxruntime reads it): per output column
        if len(given) < len(indexes):
            raise UnsupportedAttributeError(f"{node.describe()}: weights must give one value per n-gram of the pool")
        by_column = [1.0] * (max(indexes) + 1)
        for ngram, column in enumerate(indexes):
            by_column[column] = float(given[ngram])
        weights = tuple(by_column)
    return {
        "grams": tuple(grams),
        "min_n": min_n,
        "max_n": max_n,
        "max_skip": int(node.attr("max_skip_count")),
        "mode": choice(node, "mode", "TF", ("TF", "IDF", "TFIDF")),
        "weights": weights,
        "size": max(indexes) + 1,
    }


def _infer_tfidf(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    if x.dtype not in ("int32", "int64") or x.rank not in (1, 2):
        raise ShapeInferenceError(f"{node.describe()}: X must be a 1-D or 2-D int32/int64 tensor, got {x}")
    attrs = _tfidf_attrs(node)
    shape = (attrs["size"],) if x.rank == 1 else (x.shape[0], attrs["size"])
    return [TensorType("float32", shape)]


def _tfidf_flops(node, inputs, outputs):
    attrs = _tfidf_attrs(node)
    return inputs[0].numel() * (attrs["max_skip"] + 1) * (attrs["max_n"] - attrs["min_n"] + 1) * 4


OPS = (
    OpDef(
        "TfIdfVectorizer",
        (9,),
        infer=_infer_tfidf,
        fn=k_tf_idf_vectorizer,
        flops=_tfidf_flops,
        attrs=_tfidf_attrs,
        ATTRS={
            "max_gram_length": INT,
            "max_skip_count": INT,
            "min_gram_length": INT,
            "mode": STR,
            "ngram_counts": INTS,
            "ngram_indexes": INTS,
            "pool_int64s": INTS,
            "weights": FLOATS,
        },
    ),
)
