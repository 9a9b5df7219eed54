"""What a device of the base install does, in this fresh process: pin the trust root, inspect a
package, verify + build + evaluate it on the site's own records, and release private inference.

    python tests/device_flow.py [--absent] PACKAGE SITE_FILE DEVICE_HOME ROOT_JSON INPUT OUTPUT

``--absent`` first makes every optional dependency (:data:`OPTIONAL`) unimportable in this process,
as if it were not installed (tests/test_install_imports.py runs it so in the full venv); without it
the process uses what its venv holds (tests/e2e/test_install_profiles.py runs it in a fresh venv of
the base install). Prints one JSON line: the exit code of each command, the evaluation's counts,
the ledger's total, and which optional dependencies the process imported.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sys
from pathlib import Path

#: Nothing of these is installed on a device of the base profile (pyproject's dependencies).
OPTIONAL = ("torch", "opacus", "onnx", "onnxruntime", "onnxscript", "sklearn", "scipy", "matplotlib", "ray",
            "flwr", "dp_accounting", "PIL", "threadpoolctl", "uvicorn", "httpx", "grpc", "transformers")

#: A device's site: x86-64, its own npz records, the pinned trust root beside the file.
SITE_YAML = """\
site: lean-1
target: x86-64
privacy:
  epsilon_budget: 4.0
  delta: 1.0e-5
  epsilon_per_round: 1.0
  eval_epsilon: 0.05
data:
  kind: npz
  path: data.npz
  input_shape: [1, 8, 8]
  num_classes: 10
agent:
  trust_root: root.json
"""


def device_files(folder: Path, package: bytes, root_json: bytes) -> dict[str, Path]:
    """A device's folder for site ``lean-1``: its YAML, root.json, the package, an input batch of 5
    and 200 labelled records; returns the paths :func:`main` takes, by name."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    (folder / "site.yaml").write_text(SITE_YAML)
    (folder / "root.json").write_bytes(root_json)
    np.savez(folder / "data.npz", x=rng.random((200, 1, 8, 8), dtype=np.float32), y=rng.integers(0, 10, 200))
    np.save(folder / "x.npy", rng.random((5, 1, 8, 8), dtype=np.float32))
    (folder / "model.cpkg").write_bytes(package)
    return {"package": folder / "model.cpkg", "site": folder / "site.yaml", "home": folder / "home",
            "root": folder / "root.json", "x": folder / "x.npy", "out": folder / "out.npy"}


def check(result: dict, out: Path) -> None:
    """What :func:`main` must report for the device of :func:`device_files`."""
    import numpy as np

    assert result["codes"] == {"version": 0, "help": 0, "init": 0, "inspect": 0, "infer": 0}, result
    # the held-out records: each of the 200 by a keyed hash (eval_fraction 0.2), so about 40
    assert 0 < result["total"] < 200 and 0 <= result["correct"] <= result["total"], result
    assert math.isclose(result["spent_after_eval"], 0.05), result
    assert np.load(out, allow_pickle=False).shape == (5, 10)
    assert result["imported"] == [], result


def evaluate(package: Path, site_file: Path, home: Path, root: Path) -> dict:
    """Verify, build and evaluate ``package`` on the site's held-out records, releasing the noisy
    counts under a ledger claim, as the ClientApp's evaluate does (without a Flower message)."""
    import numpy as np

    from cuvil_edge.agent.runtime import AgentRuntime
    from cuvil_edge.config import load_site
    from cuvil_edge.config.home import site_state_dir
    from cuvil_edge.datasets.site_files import load_site_data
    from cuvil_edge.datasets.split import load_split_key
    from cuvil_edge.privacy.counts import CountsMechanism

    site = load_site(site_file)
    agent = AgentRuntime(site, site_state_dir(site, home), root)
    activated = agent.activate(package.read_bytes())
    ledger = agent.ledger()
    plan = CountsMechanism(2, site.privacy.eval_epsilon).plan(2, ledger.delta)
    with ledger.claim(plan.event(), key="eval-local-1"):
        _, held_out = load_site_data(site.data, activated.model.graph, cache_dir=agent.state_dir / "data-cache",
                                     split_key=load_split_key(agent.state_dir))
        correct = agent.correct(activated.model, held_out.x, held_out.y)
        noisy = plan.apply(plan.prepare(np.array([correct, len(held_out.y)]), None, None), None)
    return {"correct": correct, "total": len(held_out.y), "noisy": [int(v) for v in noisy],
            "spent_after_eval": ledger.spent()}


def main(package: Path, site_file: Path, home: Path, root: Path, x: Path, out: Path) -> dict:
    from cuvil_edge.cli.main import main as cli

    def run(*args: str) -> int:
        with contextlib.redirect_stdout(io.StringIO()):
            return cli(list(args))

    codes = {"version": run("--version"), "help": run("--help"),
             "init": run("agent", "init", "--site", str(site_file), "--trust-root", str(root), "--home", str(home)),
             "inspect": run("inspect", str(package))}
    result = evaluate(package, site_file, home, root)
    codes["infer"] = run("agent", "infer", str(package), "--site", str(site_file), "--input", str(x),
                         "--epsilon", "0.5", "--output", str(out), "--home", str(home), "--trust-root", str(root))
    imported = sorted(m for m in OPTIONAL if sys.modules.get(m) is not None)
    return {"codes": codes, **result, "imported": imported}


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--absent":
        args = args[1:]
        for name in OPTIONAL:
            sys.modules[name] = None  # import raises ImportError and find_spec finds nothing: not installed
    print(json.dumps(main(*(Path(a) for a in args))))
