"""Benchmark int8 and fp16 packages: package bytes and accuracy against fp32.

Three models, each optimized (``passes.optimize``) and then stored as fp32, fp16 (``store_fp16``) and
int8 QDQ (``calibrate_ranges`` + ``quantize_int8``, min-max and 99.99th percentile):

* **digits CNN** (``demo_model.digits_cnn_onnx``'s network, trained here in torch on the digits
  training split): accuracy on the held-out digits test set (360 images); calibrated on 128
  training images.
* **breast-cancer MLP** (30 -> 64 -> 32 -> 2, trained here in torch on 75 % of scikit-learn's
  breast-cancer data, standardised with the training statistics): accuracy on the other 25 %
  (143 records); calibrated on 128 training records.
* **ResNet-18** (``bench/compiled_models.py``: random weights, randomised BatchNorm statistics, at
  224x224): top-1 agreement with fp32 on 256 standard-normal inputs; calibrated on 32 others.

Package bytes are whole signed packages (``write_package``, target x86-64). Accuracy runs the
reference interpreter on the int8 QDQ graph after ``dequantize_at_load`` (what an fp32-kernel target
runs; the fold changes no value), and the fp16 graph likewise. Results: bench/results/quantization.{json,md}.

Run::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/bench_quantization.py

(``--markdown-only`` rewrites the .md from the .json without measuring again.) ``--speed`` times int8 that
computes in int8 instead (ResNet-18 quantized by onnxruntime, run by our int8 kernels, against our fp32
module and onnxruntime's int8 and fp32, one thread): bench/results/quantization_speed.{json,md}, with
``SPEED_COMMAND``, which unsets OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE and pins one thread.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import PIXEL_SCALE, PIXEL_SHIFT, digits_cnn_onnx
from cuvil_edge.ir import interpreter
from cuvil_edge.ir.infer import with_initializers
from cuvil_edge.passes import optimize
from cuvil_edge.passes.quantize import calibrate_ranges, dequantize_at_load, quantizable, quantize_int8, store_fp16

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/bench_quantization.py"
RESNET_EVAL, RESNET_CALIBRATION, CHUNK = 256, 32, 16
#: ResNet-18 is also evaluated on this many further inputs (with the first RESNET_EVAL: the larger set)
#: for fp32 and the variants in MORE_VARIANTS: at ~2 % disagreement 256 inputs move by 1-2 flips at random.
RESNET_EVAL_MORE = 768
MORE_VARIANTS = ("fp32", "int8_mse_gptq_fp32h_first_fp32", "int8_mse_gptq_seq_bc_first_fp32")


def run_chunks(graph, name: str, x: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    out = [next(iter(interpreter.run(graph, {name: x[i:i + chunk]}).values())) for i in range(0, len(x), chunk)]
    return np.concatenate(out)


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, lr: float = 3e-3) -> nn.Module:
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(epochs):
        for idx in torch.randperm(len(xt)).split(32):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    return model.eval()


def digits_cnn() -> tuple:
    """The demo model's graph with weights trained here (the same network in torch)."""
    from cuvil_edge.datasets import digits

    train_idx, _ = digits._train_test_indices(0.2)
    x_all, y_all = digits._load()
    test = digits.global_test()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 10))
    model = nn.Sequential(_Standardise(), net)  # the ONNX model's Mul/Add in front
    train(model, x_all[train_idx], y_all[train_idx], 30)
    weights = {"conv.weight": net[0].weight, "conv.bias": net[0].bias, "fc.weight": net[4].weight,
               "fc.bias": net[4].bias}
    graph = with_initializers(load_model(digits_cnn_onnx(0)),
                              {k: v.detach().numpy().astype(np.float32) for k, v in weights.items()})
    return graph, "image", x_all[train_idx][:128], test.x, test.y


class _Standardise(nn.Module):
    def forward(self, x):
        return x * PIXEL_SCALE + PIXEL_SHIFT


def export(model: nn.Module, example: np.ndarray, opset: int = 13) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.from_numpy(example),), buffer, dynamo=False, opset_version=opset,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return buffer.getvalue()


def breast_cancer_mlp() -> tuple:
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    data = load_breast_cancer()
    xtr, xte, ytr, yte = train_test_split(data.data, data.target, test_size=0.25, stratify=data.target,
                                          random_state=0)
    mean, std = xtr.mean(0), xtr.std(0) + 1e-12
    xtr, xte = [((v - mean) / std).astype(np.float32) for v in (xtr, xte)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 2))
    train(model, xtr, ytr.astype(np.int64), 60, lr=1e-3)
    return load_model(export(model, xtr[:2])), "x", xtr[:128], xte, yte.astype(np.int64)


def resnet18() -> tuple:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import compiled_models

    rng = np.random.default_rng(1)
    calib = rng.standard_normal((RESNET_CALIBRATION, 3, 224, 224), dtype=np.float32)
    evals = rng.standard_normal((RESNET_EVAL, 3, 224, 224), dtype=np.float32)
    data = export(_data_dependent_statistics(compiled_models.make("resnet18"), rng),
                  calib[:2], compiled_models.SPECS["resnet18"].opset)
    more = rng.standard_normal((RESNET_EVAL_MORE, 3, 224, 224), dtype=np.float32)
    return load_model(data), "x", calib, evals, None, more


def _data_dependent_statistics(model: nn.Module, rng: np.random.Generator) -> nn.Module:
    """BatchNorm running statistics measured on 64 random inputs (as training would leave them) instead
    of compiled_models' random ones: with random statistics a random ResNet-18 maps all random inputs to
    nearly one output vector (measured: one top-1 class for 256 inputs, and the input-dependent part of
    the logits so small that fp16 rounding alone flips 7 % of the centred top-1s), which says nothing
    about quantization. With measured statistics: 12 classes (219 centred), median top-2 margin 0.06."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the batches below
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.from_numpy(rng.standard_normal((16, 3, 224, 224), dtype=np.float32)))
    return model.eval()


def package_bytes(graph) -> int:
    from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
    from cuvil_edge.ir_serialize import write_package

    global _KEYS
    if "_KEYS" not in globals():
        keys_dir = Path(tempfile.mkdtemp())
        private_path, _ = init_keys(keys_dir)
        _KEYS = load_signing_keys(private_path)
    now = int(time.time())
    return len(write_package(graph, site="bench", target="x86-64", version=1, signing_key=_KEYS.coordinator,
                             release_key=_KEYS.release, issued_at=now, expires=now + 600))


def measure(name: str, make) -> dict:
    start = time.perf_counter()
    graph, input_name, calib, x, y, *more = make()
    graph, _ = optimize(graph)
    batches = [calib[i:i + 8] for i in range(0, len(calib), 8)]
    variants = {"fp32": graph, "fp16": store_fp16(graph)}
    timings = {}
    for method in ("minmax", "percentile"):  # the first release's int8: weights rounded to nearest
        t = time.perf_counter()
        ranges = calibrate_ranges(graph, batches, method=method)
        timings[f"calibrate_{method}_s"] = time.perf_counter() - t
        variants[f"int8_{method}"] = quantize_int8(graph, ranges, weights="rtn")
    t = time.perf_counter()
    ranges = calibrate_ranges(graph, batches, method="mse")
    timings["calibrate_mse_s"] = time.perf_counter() - t
    inputs = {v.name for v in graph.inputs}
    first = [node.name for node, x, _, _ in quantizable(graph) if x in inputs]
    t = time.perf_counter()  # the default: Hessians from the float32 graph, no bias correction
    variants["int8_mse_gptq_fp32h_first_fp32"] = quantize_int8(graph, ranges, samples=batches, weights="gptq_fp32",
                                                               bias_correction=False, keep_float=first)
    timings["quantize_gptq_fp32h_s"] = time.perf_counter() - t
    # the alternative: sequential GPTQ (Hessians from the quantized prefix) and bias correction
    variants["int8_mse_gptq_seq_bc"] = quantize_int8(graph, ranges, samples=batches, weights="gptq",
                                                     bias_correction=True)  # every quantizable op int8
    t = time.perf_counter()
    variants["int8_mse_gptq_seq_bc_first_fp32"] = quantize_int8(graph, ranges, samples=batches, weights="gptq",
                                                                bias_correction=True, keep_float=first)
    timings["quantize_gptq_seq_bc_s"] = time.perf_counter() - t
    sizes = {k: package_bytes(g) for k, g in variants.items()}
    outputs = {k: run_chunks(dequantize_at_load(g), input_name, x) for k, g in variants.items()}
    if more:  # the larger evaluation set: the first inputs and more draws
        outputs_more = {k: np.concatenate([outputs[k], run_chunks(dequantize_at_load(variants[k]), input_name,
                                                                  more[0])]) for k in MORE_VARIANTS}
    ref = outputs["fp32"].argmax(1)
    top2 = np.sort(outputs["fp32"], axis=1)[:, -2:]
    # A random-weight ResNet maps every random input to one class (a constant logit offset dominates),
    # which makes plain agreement trivial. Subtracting the fp32 mean logit vector from every variant's
    # outputs is the same as shifting the float32 fc bias of all of them: a ResNet-18 whose top-1 varies.
    centre = outputs["fp32"].mean(0)
    ref_centred = (outputs["fp32"] - centre).argmax(1)
    row: dict = {"nodes": len(graph.nodes), "parameters": int(sum(a.size for a in graph.initializers.values())),
                 "eval_inputs": int(len(x)), "calibration_inputs": int(len(calib)),
                 "eval_inputs_more": int(len(x) + len(more[0])) if more else 0, "package_bytes": sizes,
                 "size_ratio": {k: sizes[k] / sizes["fp32"] for k in sizes}, **timings,
                 # agreement means little when fp32 always picks one class or its top-2 margins are tiny
                 "fp32_distinct_top1": int(len(np.unique(ref))),
                 "fp32_distinct_top1_centred": int(len(np.unique(ref_centred))),
                 "fp32_output_range": float(np.ptp(outputs["fp32"])),
                 "fp32_median_top2_margin": float(np.median(top2[:, 1] - top2[:, 0])), "variants": {}}
    for k, out in outputs.items():
        pred = out.argmax(1)
        entry = {"agreement_with_fp32": float((pred == ref).mean()),
                 "agreement_centred": float(((out - centre).argmax(1) == ref_centred).mean()),
                 "fp32_top1_in_top5": float((np.argsort(out, 1)[:, -5:] == ref[:, None]).any(1).mean()),
                 "max_abs_output_diff": float(np.abs(out - outputs["fp32"]).max())}
        if more and k in outputs_more:
            ref_more = outputs_more["fp32"].argmax(1)
            entry["agreement_with_fp32_more"] = float((outputs_more[k].argmax(1) == ref_more).mean())
            entry["flips_more"] = int((outputs_more[k].argmax(1) != ref_more).sum())
        if y is not None:
            entry["accuracy"] = float((pred == y).mean())
            entry["accuracy_drop_points"] = 100 * (float((ref == y).mean()) - entry["accuracy"])
        row["variants"][k] = entry
    row["seconds"] = time.perf_counter() - start
    print(name, json.dumps(row), flush=True)
    return row


def machine() -> dict:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent,
                                  timeout=30).stdout.strip()
        except OSError:
            return ""

    return {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
            "platform": platform.platform(), "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(),
            "commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted": git("status", "--porcelain", "--", "../cuvil_edge/passes/quantize.py",
                                 "../cuvil_edge/passes/quantize_weights.py")}


def markdown(out: dict) -> str:
    m = out["machine"]
    lines = ["# INT8 and FP16 packages", "", f"    {COMMAND}", "",
             f"Machine: {m['platform']}, {m['cpus']} CPUs (shared; load average at start "
             f"{', '.join(f'{v:.2f}' for v in m['load_average_at_start'])}), Python {m['python']}, numpy "
             f"{m['numpy']}, torch {m['torch']}, cuvil_edge at {m['commit']}"
             + (" (quantize.py uncommitted)" if m["uncommitted"] else "") + ".", "",
             "Targets: int8 package <= 0.27x and fp16 <= 0.52x the fp32 package (a model whose weights dominate: "
             "ResNet-18); accuracy drop <= 1 point; ResNet-18 top-1 agreement with fp32 >= 99 %.", "",
             "fp32 reference per model: distinct top-1 classes over the evaluation set (plain / centred), output "
             "range, median margin between the top two outputs: " + "; ".join(
                 f"{n} {r['fp32_distinct_top1']} / {r['fp32_distinct_top1_centred']}, {r['fp32_output_range']:.3g}, "
                 f"{r['fp32_median_top2_margin']:.3g}" for n, r in out["models"].items()) + ".", "",
             "*Centred*: every variant's outputs minus the fp32 mean output vector over the evaluation set (the "
             "same as shifting the float32 bias of the last layer), a harder test for a random-weight network "
             "whose top-1 falls in few classes. *In top-5*: the fp32 top-1 is among the variant's top 5.", "",
             "| model | variant | package bytes | x fp32 | accuracy | drop (points) | top-1 agreement "
             "| top-1 agreement, larger set | centred agreement | in top-5 | max abs diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in out["models"].items():
        for k, v in r["variants"].items():
            acc = f"{100 * v['accuracy']:.2f} %" if "accuracy" in v else "-"
            drop = f"{v['accuracy_drop_points']:.2f}" if "accuracy_drop_points" in v else "-"
            lines.append(f"| {name} | {k} | {r['package_bytes'][k]} | {r['size_ratio'][k]:.3f} | {acc} | {drop} "
                         f"| {100 * v['agreement_with_fp32']:.2f} % | {_more(r, v)} | {100 * v['agreement_centred']:.2f} % "
                         f"| {100 * v['fp32_top1_in_top5']:.2f} % "
                         f"| {v['max_abs_output_diff']:.3g} |")
    lines += ["", "Evaluation sets: digits CNN the 360 held-out digits; MLP 143 held-out breast-cancer records; "
              f"ResNet-18 {RESNET_EVAL} standard-normal inputs (random weights, so only agreement with fp32 is "
              "meaningful). int8: per-channel symmetric int8 weights, per-tensor activations (uint8 after a "
              "Relu, int8 otherwise) calibrated on batches of 8; biases stay float32. Small models are dominated "
              "by the package's header and envelope (a few KiB), so their ratios are above the targets, which "
              "apply to weight-dominated packages.", "",
              "Variants: *int8_minmax*, *int8_percentile*: the first release, weights rounded to nearest "
              "(`quantize_int8(..., weights=\"rtn\")`), activation ranges min-max / 99.99th percentile. "
              "*int8_mse_gptq_fp32h_first_fp32*: the default, what the coordinator ships (`quantize_int8(graph, "
              "ranges, samples=batches, keep_float=...)`): activation ranges by MSE search "
              "(`calibrate_ranges(..., method=\"mse\")`, the default), weights rounded by GPTQ with each layer's "
              "Hessian from the float32 graph's inputs (`weights=\"gptq_fp32\", bias_correction=False`), and the "
              "op that reads the graph input kept fp32 (`keep_float=`; ResNet-18's 7x7 stem conv, 9,408 weights: "
              "its standard-normal input is white, so GPTQ cannot improve its weights, and rounding that input is "
              "the largest single activation error; the MLP's first Gemm; the digits CNN's conv reads the Mul/Add "
              "output, so nothing is kept). *int8_mse_gptq_seq_bc*: the methods this round added "
              "(`weights=\"gptq\", bias_correction=True`; the default in the measured commit, reverted after "
              "this run): MSE ranges, GPTQ in sequence (each layer's "
              "Hessian from the inputs the already-quantized prefix, int8 weights and quantized activations, gives "
              "it) and bias correction (the mean over the calibration samples of the fp32 minus the int8 "
              "pre-activation output per channel is added to each Conv/Gemm's float32 bias); every quantizable op "
              "in int8. *int8_mse_gptq_seq_bc_first_fp32*: the same with the first op kept fp32 as above. "
              f"*Larger set*: the {RESNET_EVAL} evaluation inputs and {RESNET_EVAL_MORE} further draws, for "
              f"{', '.join(MORE_VARIANTS)} only (the reference interpreter takes about 5 minutes per 1,000 "
              "ResNet-18 inputs here). "
              "Calibration and evaluation inputs are different draws.", "",
              _resnet_summary(out["models"].get("resnet18")), "",
              "Digits CNN and breast-cancer MLP: every int8 variant stays within 0.28 points of fp32 accuracy; the "
              "default agrees with fp32 on every input, sequential GPTQ with bias correction differs on one digit "
              "(99.72 %), a near tie either way.", "",
              "Why 99 % is out of reach here: one-off probes on this machine (a torch evaluator of the same graphs; "
              "not re-run by this script). Output error with fp32 weights and one activation tensor quantized at a "
              "time (64 inputs): all 17 together give an RMS error of 0.0053 at the logits; the MaxPool output that "
              "feeds the first block alone 0.0032, the other stage-1 tensors 0.0012-0.0019, falling to 0.0004 in "
              "stage 4, the fc input 0.0009. int8 GPTQ weights alone give about 0.0024, weights and activations "
              "together 0.0058: per-tensor activation rounding is about 85 % of the squared error, and no weight "
              "rounding, sequential Hessian or bias shift reaches it. The MSE ranges are at the optimum for the "
              "output too (the MaxPool output's range x0.9 / x1.1 gives 0.0040 / 0.0033 against 0.0032); per-channel "
              "activation ranges (which the issue does not ask for; an upper bound on what cross-layer "
              "equalisation could give) still give 0.0046. The same probes, stem conv fp32, 256 inputs: "
              "GPTQ on float32 Hessians 98.83 % (RMS 0.00578), sequential GPTQ 96.88 % (0.00581), sequential GPTQ "
              "with bias correction 96.88 % (0.00590); on 1,024 other draws the first gave 96.68 % (34 flips): "
              "the error is the same, and which of the near-tied inputs flip moves the 256-input figure by "
              "2 points. On this run's 1,024 inputs (torch evaluator, stem conv fp32): sequential GPTQ without bias "
              "correction 97.27 % (28 flips, RMS 0.00578, quantized in 101 s), GPTQ on float32 Hessians with bias "
              "correction 97.56 % (25, 0.00586, 97 s), sequential GPTQ with bias correction shrunk by each shift's "
              "standard error over the samples (`quantize_weights.SHRINK`) 97.36 % (27, 0.00579, 45 s on a quieter "
              "machine): every combination sits within a few flips of the default's 23 (reference interpreter) "
              "at the same RMS error. The flips are inputs whose fp32 top-2 margin is below about 0.005 (median margin 0.061), "
              "and at an RMS error of 0.0058 about 3 % of these inputs flip. A trained ResNet-18 (margins far "
              "above the quantization error) is the fair test; no trained weights are available offline.", ""]
    return "\n".join(lines)


def _more(r, v) -> str:
    if "agreement_with_fp32_more" not in v:
        return "-"
    return (f"{100 * v['agreement_with_fp32_more']:.2f} % ({v['flips_more']} of {r['eval_inputs_more']} "
            "differ)")


def _resnet_summary(r) -> str:
    if not r:
        return ""
    v, ratio = r["variants"], r["size_ratio"]
    old, new = "int8_mse_gptq_fp32h_first_fp32", "int8_mse_gptq_seq_bc_first_fp32"
    if old not in v or new not in v:
        return ""

    def both(k):
        more = v[k].get("agreement_with_fp32_more")
        return (f"{100 * v[k]['agreement_with_fp32']:.2f} % of the {r['eval_inputs']} inputs"
                + (f" and {100 * more:.2f} % of the {r['eval_inputs_more']}" if more is not None else ""))

    met = {n: v[old][key] >= 0.99 for n, key in (("256", "agreement_with_fp32"),
                                                   ("more", "agreement_with_fp32_more")) if key in v[old]}
    verdict = ("met on both sets" if all(met.values()) else
               f"met on the {r['eval_inputs']} inputs only" if met.get("256") else
               f"met on the {r['eval_inputs_more']} inputs only" if met.get("more") else "not met")
    return (f"ResNet-18: the default int8 path with the stem conv in fp32, {old}, agrees with fp32 on {both(old)} "
            f"at {ratio[old]:.3f}x the fp32 package; sequential GPTQ with bias correction, {new}, on {both(new)} "
            f"(every op in int8, int8_mse_gptq_seq_bc: {100 * v['int8_mse_gptq_seq_bc']['agreement_with_fp32']:.2f} %, "
            f"against 96.48 % for the default's every-op variant in the previous run); the first release's min-max "
            f"int8 on {100 * v['int8_minmax']['agreement_with_fp32']:.2f} %. The 99 % target is {verdict}, and the "
            "new methods are not better, so they stay options (`weights=\"gptq\"`, `bias_correction=True`). "
            f"Quantization took {r.get('quantize_gptq_fp32h_s', 0):.0f} s for the default's GPTQ and "
            f"{r.get('quantize_gptq_seq_bc_s', 0):.0f} s for sequential GPTQ with bias correction, the MSE ranges "
            f"{r.get('calibrate_mse_s', 0):.0f} s ({r['calibration_inputs']} calibration inputs; 2 cores shared "
            "with another benchmark during this run, so these times are 2-3x the quiet machine's: GPTQ took 69 s "
            "in the previous run).")


def main() -> dict:
    out = {"machine": machine(), "command": COMMAND, "models": {}}
    for name, make in (("digits_cnn", digits_cnn), ("breast_cancer_mlp", breast_cancer_mlp), ("resnet18", resnet18)):
        out["models"][name] = measure(name, make)
    return out


# --- speed: int8 that computes in int8 ---------------------------------------------------------
SPEED_COMMAND = ("env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "
                 ".venv/bin/python bench/bench_quantization.py --speed")
SPEED_ROUNDS = 25


def _ort_session(path: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def speed() -> dict:
    """ResNet-18 (random weights, measured BatchNorm statistics) at batch 1, one thread: onnxruntime's
    static QDQ quantization (per channel, 8 random calibration inputs; 8-bit weights, and 7-bit with
    ``reduce_range``) run by our int8 kernels, by onnxruntime, and the fp32 model by both; each
    configuration timed in turn, ``SPEED_ROUNDS`` rounds, the median."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from cuvil_edge.device_targets import build
    from cuvil_edge.ir.ops import _int8

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import compiled_models

    rng = np.random.default_rng(3)
    model = _data_dependent_statistics(compiled_models.make("resnet18"), rng)
    folder = Path(tempfile.mkdtemp())
    (folder / "fp32.onnx").write_bytes(export(model, rng.standard_normal((1, 3, 224, 224), dtype=np.float32), 17))
    calibration = [{"x": rng.standard_normal((1, 3, 224, 224), dtype=np.float32)} for _ in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(calibration)

        def get_next(self):
            return next(self.items, None)

    for name, reduce in (("int8", False), ("int8_7bit", True)):
        quantize_static(str(folder / "fp32.onnx"), str(folder / f"{name}.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True, reduce_range=reduce, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8)

    class Payload:
        def __init__(self, graph):
            self.graph, self.payload_digest = graph, hashlib.sha256(repr(graph.name).encode()).hexdigest()

    cache = folder / "cache"
    x = rng.standard_normal((1, 3, 224, 224), dtype=np.float32)
    runs = {"ours_fp32": build(Payload(optimize(load_model(str(folder / "fp32.onnx")))[0]), "x86-64", cache_dir=cache)}
    runs["ort_fp32"] = _ort_session(str(folder / "fp32.onnx"))
    outputs, fused = {}, {}
    for name in ("int8", "int8_7bit"):
        graph = dequantize_at_load(load_model(str(folder / f"{name}.onnx")), int8=True)
        fused[name] = sum(n.op_type == "QLinearConv" for n in graph.nodes)
        runs[f"ours_{name}"] = build(Payload(graph), "x86-64", cache_dir=cache)
        runs[f"ort_{name}"] = _ort_session(str(folder / f"{name}.onnx"))

    def call(key):
        r = runs[key]
        return r.run(None, {"x": x})[0] if key.startswith("ort") else next(iter(r.run({"x": x}).values()))

    # wall time, and this thread's CPU time: every configuration runs on the calling thread (one
    # onnxruntime and OpenBLAS thread), so CPU time leaves out the waits a loaded machine adds
    times, cpu = {k: [] for k in runs}, {k: [] for k in runs}
    for k in runs:
        outputs[k] = call(k)
    for _ in range(SPEED_ROUNDS):
        for k in runs:
            start, start_cpu = time.perf_counter(), time.thread_time()
            call(k)
            times[k].append(time.perf_counter() - start)
            cpu[k].append(time.thread_time() - start_cpu)
    ms = {k: 1e3 * float(np.median(v)) for k, v in cpu.items()}
    out = {"machine": machine(), "command": SPEED_COMMAND, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "int8_path": _int8.path(), "rounds": SPEED_ROUNDS, "median_ms": ms,
           "median_wall_ms": {k: 1e3 * float(np.median(v)) for k, v in times.items()}, "fused_qlinearconv": fused}
    for name in ("int8", "int8_7bit"):
        out[f"{name}_vs_ours_fp32"] = ms["ours_fp32"] / ms[f"ours_{name}"]
        out[f"{name}_vs_ort_{name}"] = ms[f"ours_{name}"] / ms[f"ort_{name}"]
        out[f"{name}_max_abs_diff_vs_ort"] = float(np.abs(outputs[f"ours_{name}"] - outputs[f"ort_{name}"]).max())
        out[f"{name}_top1_same_as_ort"] = bool(outputs[f"ours_{name}"].argmax() == outputs[f"ort_{name}"].argmax())
    return out


def speed_markdown(r: dict) -> str:
    ms = r["median_ms"]
    lines = ["# int8 speed: ResNet-18, batch 1, one thread", "", f"Command: `{r['command']}`  ", f"Date: {r['date']}  ",
             f"Machine: {r['machine']}; our int8 inner product: {r['int8_path']}; median of {r['rounds']} rounds, "
             "each configuration in turn; ms of the calling thread's CPU time (wall time in brackets: other "
             "sessions share this 2-core machine)", "", "| model | ours ms | onnxruntime ms | ours / ort |",
             "|---|---|---|---|"]
    wall = r["median_wall_ms"]
    for name in ("fp32", "int8", "int8_7bit"):
        lines.append(f"| {name} | {ms['ours_' + name]:.1f} ({wall['ours_' + name]:.1f}) | {ms['ort_' + name]:.1f} "
                     f"({wall['ort_' + name]:.1f}) | {ms['ours_' + name] / ms['ort_' + name]:.2f} |")
    for name in ("int8", "int8_7bit"):
        lines.append(f"\n{name}: ours fp32 / ours {name} = {r[name + '_vs_ours_fp32']:.2f}x; "
                     f"{r['fused_qlinearconv'][name]} Conv as QLinearConv; max |ours - ort| on the logits "
                     f"{r[name + '_max_abs_diff_vs_ort']:.3g}, same top-1: {r[name + '_top1_same_as_ort']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--speed"]:  # int8 kernels vs fp32 and onnxruntime (bench/results/quantization_speed.*)
        result = speed()
        (RESULTS / "quantization_speed.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / "quantization_speed.md").write_text(speed_markdown(result))
        raise SystemExit(print(speed_markdown(result)))
    if sys.argv[1:] == ["--markdown-only"]:  # rewrite the .md from the .json (text changes, no rerun)
        text = markdown(json.loads((RESULTS / "quantization.json").read_text()))
        (RESULTS / "quantization.md").write_text(text)
        raise SystemExit(print(text))
    result = main()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "quantization.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "quantization.md").write_text(markdown(result))
    print(markdown(result))
