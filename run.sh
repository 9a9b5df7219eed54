#!/usr/bin/env bash
# One entry point for people and CI.
#   ./run.sh demo [cuvil-edge demo options]   set up .venv, run the demo federation
#   ./run.sh test [pytest options]            set up .venv, run the whole test suite (parallel)
# Set-up is reused when .venv is already in step with pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")"

VENV=.venv
STAMP="$VENV/.cuvil-edge-setup"

find_python() {
  for candidate in python3.11 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
      echo "$candidate"; return 0
    fi
  done
  echo "cuvil-edge needs Python >= 3.11 on PATH" >&2; return 1
}

setup() {
  if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ]; then
    return 0
  fi
  echo "setting up $VENV (first run takes a few minutes)..." >&2
  [ -x "$VENV/bin/python" ] || "$(find_python)" -m venv "$VENV"
  local pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install --upgrade pip
  # torch first, pinned: this CPU build comes from local disk; a bare `torch`
  # requirement (from opacus or flwr) would otherwise pull a multi-GB CUDA build.
  "${pip[@]}" install "torch==2.13.0"
  # every profile (device, training, coordinator, simulation: pyproject's extras) and the tests
  "${pip[@]}" install -e ".[all,test]"
  touch "$STAMP"
}

command="${1:-}"
shift || true
case "$command" in
  demo) setup; exec "$VENV/bin/cuvil-edge" demo "$@" ;;
  # parallel workers (pytest-xdist; tests/conftest.py keeps them apart): more workers than cores,
  # since the end-to-end tests mostly wait on Flower's polling; CUVIL_EDGE_TEST_WORKERS=0 runs
  # serially. loadgroup hands out one test (or one xdist_group) at a time, in collection order,
  # which tests/conftest.py starts with the longest tests. Bytecode is written even where the
  # environment says not to (PYTHONDONTWRITEBYTECODE): the suite starts some hundred Python processes
  # (workers, agents, Flower's), and each would otherwise compile cuvil_edge, and pytest rewrite
  # every test module, again (git ignores __pycache__; the wheel and Flower App builds leave it out).
  test) setup; unset PYTHONDONTWRITEBYTECODE; exec "$VENV/bin/python" -m pytest -n "${CUVIL_EDGE_TEST_WORKERS:-3}" --dist loadgroup \
          --no-loadscope-reorder "$@" ;;
  setup) setup ;;
  *) echo "usage: ./run.sh demo|test|setup [options]" >&2; exit 64 ;;
esac
