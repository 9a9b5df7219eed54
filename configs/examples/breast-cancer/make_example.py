"""Write the breast-cancer example's data and model (run once; the outputs are committed).

    .venv/bin/python configs/examples/breast-cancer/make_example.py [OUT_DIR]

From scikit-learn's bundled Wisconsin diagnostic breast-cancer data (569 records, 30 features):

- ``data/test.csv``: a stratified 20 % the coordinator holds back to score the global model;
- ``data/hospital-{1,2,3}.csv``: the rest, split non-IID: hospital 1 (a referral centre) sees mostly
  malignant cases, hospital 3 (a screening clinic) mostly benign ones. Each hospital's agent reads
  only its own file (site YAML ``data: kind: csv``).
- ``mlp.onnx``: an MLP exported from torch: 30 features -> scale -> Linear(30, 16) -> Tanh ->
  Linear(16, 2) -> logits (malignant, benign). The scale maps each feature's published range (the
  dataset's documented min and max, from its description: public constants, not statistics of any
  hospital's records) onto [-1, 1]. Tanh rather than ReLU: bounded activations keep DP-SGD's
  clipped gradients informative (Papernot et al., 2021).

The output is deterministic: the same files every run.
"""

from __future__ import annotations

import csv
import io
import re
import sys
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CLASSES = ("malignant", "benign")  # scikit-learn's target 0 and 1
#: Share of each class's training records per hospital (referral centre .. screening clinic).
SHARES = {"malignant": (0.6, 0.3, 0.1), "benign": (0.15, 0.35, 0.5)}
HIDDEN = 16


def columns(names) -> list[str]:
    return [re.sub(r"[^a-z0-9]+", "_", n.lower()).strip("_") for n in names]


def published_ranges(descr: str, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The (min, max) of every feature from the dataset's documented summary statistics."""
    rows = re.findall(r"^\S.*?\):\s+([0-9.]+)\s+([0-9.]+)\s*$", descr, flags=re.M)
    assert len(rows) == count, f"expected {count} documented ranges, found {len(rows)}"
    return np.array([float(a) for a, _ in rows]), np.array([float(b) for _, b in rows])


def write_csv(path: Path, header: list[str], x: np.ndarray, y: np.ndarray) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow([*header, "diagnosis"])
        for row, label in zip(x, y):
            out.writerow([*(f"{v:.6g}" for v in row), CLASSES[label]])


def split(y: np.ndarray, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """(test indices, per-hospital training indices)."""
    rng = np.random.default_rng(seed)
    test, hospitals = [], [[], [], []]
    for label, name in enumerate(CLASSES):
        members = rng.permutation(np.flatnonzero(y == label))
        cut = int(round(0.2 * len(members)))
        test.extend(members[:cut])
        rest = members[cut:]
        bounds = (np.cumsum(SHARES[name])[:-1] * len(rest)).round().astype(int)
        for i, part in enumerate(np.split(rest, bounds)):
            hospitals[i].extend(part)
    return np.sort(test), [np.sort(np.array(h)) for h in hospitals]


def export_mlp(low: np.ndarray, high: np.ndarray, seed: int = 0) -> bytes:
    import torch

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            scale = 2.0 / (high - low)
            self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32))
            self.register_buffer("shift", torch.tensor(-1.0 - low * scale, dtype=torch.float32))
            self.hidden = torch.nn.Linear(low.size, HIDDEN)
            self.out = torch.nn.Linear(HIDDEN, len(CLASSES))

        def forward(self, x):
            return self.out(torch.tanh(self.hidden(x * self.scale + self.shift)))

    torch.manual_seed(seed)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(MLP().eval(), (torch.zeros(2, low.size),), buffer, dynamo=False, opset_version=17,
                          input_names=["features"], output_names=["logits"],
                          dynamic_axes={"features": {0: "batch"}, "logits": {0: "batch"}})
    return buffer.getvalue()


def main(out: Path = HERE) -> None:
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x, y = data.data.astype(np.float64), data.target.astype(np.int64)
    header = columns(data.feature_names)
    low, high = published_ranges(data.DESCR, x.shape[1])
    test, hospitals = split(y)
    (out / "data").mkdir(parents=True, exist_ok=True)
    write_csv(out / "data" / "test.csv", header, x[test], y[test])
    for i, idx in enumerate(hospitals, start=1):
        write_csv(out / "data" / f"hospital-{i}.csv", header, x[idx], y[idx])
        print(f"hospital-{i}: {len(idx)} records, {int((y[idx] == 0).sum())} malignant")
    (out / "mlp.onnx").write_bytes(export_mlp(low, high))
    print(f"test: {len(test)} records; wrote {out / 'data'} and {out / 'mlp.onnx'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
