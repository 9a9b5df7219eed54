"""Installed size of each install profile (pyproject's extras), each in a fresh venv.

    .venv/bin/python bench/bench_install.py [--profiles base,agent,...]

Builds the wheel (`pip wheel --no-deps` of a clean copy of the source), then for each profile makes
a bare venv (`python -m venv`), installs torch==2.13.0 first where the profile holds torch (the CPU
build on local disk, as run.sh does), then ``WHEEL[extra]`` with pip's defaults, and measures the
venv's site-packages: with the bytecode pip compiles at install, and without it (what
``pip install --no-compile`` leaves, as tests/e2e/test_install_profiles.py measures; Python then
compiles only what it imports). The venv's own pip and setuptools are not counted. MB = 10^6
bytes. Results: bench/results/install.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from test_install_profiles import VENV_TOOLING, build_wheel  # noqa: E402 - the wheel the install test builds

#: (profile, extras, what machine it is for)
PROFILES = (
    ("base", "", "a device that verifies, builds, evaluates and runs `agent infer` (no Flower)"),
    ("agent", "agent", "a device in federated evaluation / inference rounds (`agent run`)"),
    ("agent,train", "agent,train", "a device that also trains with DP-SGD"),
    ("coordinator", "coordinator", "the coordinator (compile, `coordinator serve`, `run`, reports)"),
    ("sim", "sim", "`cuvil-edge demo` / simulate: coordinator and every site in one process, on Ray"),
    ("all", "all", "everything (`./run.sh` installs this and the test tools)"),
)
WITH_TORCH = {"agent,train", "sim", "all"}
TARGETS_MB = {"base": 100}
#: The venv's own tooling, present before anything is installed (not counted).
TOOLING = {"pip", "setuptools"}


def measure(site: Path) -> tuple[float, float, dict[str, float]]:
    """(MB with bytecode, MB without, MB per distribution with bytecode) of ``site``; each file is
    its distribution's by the distribution's RECORD (which lists the bytecode pip compiled too)."""
    owner: dict[Path, str] = {}
    for record in site.glob("*.dist-info/RECORD"):
        name = record.parent.name.split("-")[0].lower().replace("_", "-")
        for line in record.read_text(encoding="utf-8").splitlines():
            owner[(site / line.split(",")[0]).resolve()] = name
    total = plain = 0
    per: dict[str, int] = {}
    for path in site.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        name = owner.get(path.resolve(), "(no RECORD)")
        if name in TOOLING or path.relative_to(site).parts[0] in VENV_TOOLING:
            continue
        size = path.stat().st_size
        total += size
        plain += 0 if "__pycache__" in path.parts else size
        per[name] = per.get(name, 0) + size
    return total / 1e6, plain / 1e6, {k: v / 1e6 for k, v in per.items()}


def install(profile: str, extras: str, wheel: Path, tmp: Path) -> dict:
    venv = tmp / f"venv-{profile.replace(',', '-')}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    start = time.perf_counter()
    if profile in WITH_TORCH:
        # first, pinned: a bare `torch` requirement (from opacus) would otherwise pull a CUDA build
        subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, f"{wheel}[{extras}]" if extras else str(wheel)], check=True)
    seconds = time.perf_counter() - start
    (site,) = (venv / "lib").glob("python3*/site-packages")
    with_pyc, without_pyc, per = measure(site)
    # console scripts, and binaries some packages put there (uv, from flwr); the python links not counted
    scripts = sum(p.stat().st_size for p in (venv / "bin").iterdir() if p.is_file() and not p.is_symlink()
                  and not p.name.startswith(("pip", "python", "activate", "Activate")))
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json",
                             "--disable-pip-version-check"], capture_output=True, text=True, check=True).stdout
    distributions = sorted(d["name"] for d in json.loads(listed) if d["name"] not in ("pip", "setuptools"))
    biggest = sorted(per.items(), key=lambda kv: -kv[1])[:6]
    return {"profile": profile, "mb": round(with_pyc, 1), "mb_no_bytecode": round(without_pyc, 1),
            "bin_mb": round(scripts / 1e6, 1),
            "install_s": round(seconds, 1), "distributions": len(distributions),
            "biggest": [[k, round(v, 1)] for k, v in biggest], "names": distributions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-json", action="store_true", help="only rewrite install.md from install.json")
    parser.add_argument("--profiles", default=",".join(p for p, _, _ in PROFILES).replace("agent,train", "agent+train"),
                        help="comma-separated profiles (agent+train for agent,train)")
    args = parser.parse_args()
    if args.from_json:
        (RESULTS / "install.md").write_text(report(json.loads((RESULTS / "install.json").read_text())))
        return
    wanted = {p.replace("+", ",") for p in args.profiles.split(",")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(Path(tmp) / "build")
        for profile, extras, _ in PROFILES:
            if profile in wanted:
                rows.append(install(profile, extras, wheel, Path(tmp)))
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "names"}), flush=True)
    pip_version = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True).stdout
    result = {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
              "machine": platform.machine(), "host_pip": pip_version.split()[1], "profiles": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "install.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "install.md").write_text(report(result))
    print(report(result))


def report(result: dict) -> str:
    machine = {p: m for p, _, m in PROFILES}
    by = {r["profile"]: r for r in result["profiles"]}
    lines = ["# Installed size per install profile", "",
             f"`.venv/bin/python bench/bench_install.py` on {result['date']} (Python {result['python']}, "
             f"{result['machine']}): each profile in a fresh `python -m venv`, torch==2.13.0 (CPU) installed "
             "first where the profile holds torch, then the wheel with that extra. Size = the venv's "
             "site-packages in MB (10^6 bytes) without the venv's own pip and setuptools; \"with bytecode\" "
             "is pip's default install (every module compiled), \"no bytecode\" what `pip install "
             "--no-compile` leaves (tests/e2e/test_install_profiles.py measures that one); bin/ = what the "
             "profile adds to the venv's bin/ (console scripts, and flwr's `uv` binary), not in the other columns.", "",
             "| profile | pip install | for | with bytecode | no bytecode | bin/ | distributions | biggest (MB, with bytecode) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["profiles"]:
        spec = f"cuvil-edge[{r['profile']}]" if r["profile"] != "base" else "cuvil-edge"
        biggest = ", ".join(f"{k} {v:g}" for k, v in r["biggest"])
        lines.append(f"| {r['profile']} | `{spec}` | {machine[r['profile']]} | {r['mb']:g} | {r['mb_no_bytecode']:g} | "
                     f"{r['bin_mb']:g} | {r['distributions']} | {biggest} |")
    lines += ["", "## Against the targets", ""]
    if "base" in by:
        b = by["base"]
        met = "met" if b["mb_no_bytecode"] <= TARGETS_MB["base"] else "missed"
        lines.append(f"* base (a device without Flower), target <= {TARGETS_MB['base']} MB: {met} without bytecode "
                     f"({b['mb_no_bytecode']:g} MB), not with pip's default bytecode ({b['mb']:g} MB); numpy with its "
                     f"OpenBLAS is {100 * dict(b['biggest']).get('numpy', 0) / b['mb']:.0f} % of it, cryptography "
                     "(signatures) and rich's pygments most of the rest.")
    if "base" in by and "agent" in by:
        a, b = by["agent"], by["base"]
        added = sorted(set(a["names"]) - set(b["names"]))
        lines.append(f"* [agent] adds {a['mb'] - b['mb']:.1f} MB ({a['mb_no_bytecode'] - b['mb_no_bytecode']:.1f} "
                     f"without bytecode; and {a['bin_mb'] - b['bin_mb']:.1f} MB in bin/, flwr's `uv`): flwr and its own "
                     f"requirements only ({len(added)} distributions: "
                     f"{', '.join(added)}).")
    if "agent,train" in by:
        lines.append(f"* a training device ([agent,train]) takes {by['agent,train']['mb']:g} MB, torch most of it. "
                     "Before the extras every install, a device's too, held all of `all` and onnxscript.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
