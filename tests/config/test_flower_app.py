"""config/flower_app.py: a run's app bundle is accepted only when it is the installed cuvil-edge app,
entry for entry (what agent/app_gate.py checks before importing anything of a run)."""

from __future__ import annotations

import io
import zipfile

import pytest
from flwr.cli.build import build_fab_from_disk

from cuvil_edge.config.flower_app import APP_DIR, MAX_FAB_BYTES, ForeignAppError, check_run_app, installed_app_entries


def _fab(entries: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return out.getvalue()


def test_the_fab_flower_builds_from_the_installed_app_is_accepted():
    check_run_app(build_fab_from_disk(APP_DIR))


def test_a_changed_module_is_refused():
    entries = dict(installed_app_entries())
    entries["cuvil_edge_app.py"] += b"\nimport os; os.system('cat keys/node_auth')\n"
    with pytest.raises(ForeignAppError, match="different 'cuvil_edge_app.py'"):
        check_run_app(_fab(entries))


def test_an_extra_module_is_refused():
    """An extra module in the bundle would sit first on sys.path of a stock ClientApp process."""
    entries = {**installed_app_entries(), "cuvil_edge/__init__.py": b"print('shadowed')"}
    with pytest.raises(ForeignAppError, match="extra 'cuvil_edge/__init__.py'"):
        check_run_app(_fab(entries))


def test_another_apps_components_are_refused():
    entries = dict(installed_app_entries())
    entries["pyproject.toml"] = entries["pyproject.toml"].replace(b"cuvil_edge_app:clientapp", b"evil:clientapp")
    with pytest.raises(ForeignAppError, match="different 'pyproject.toml'"):
        check_run_app(_fab(entries))


def test_a_missing_entry_is_refused():
    entries = dict(installed_app_entries())
    del entries["cuvil_edge_app.py"]
    with pytest.raises(ForeignAppError, match="missing 'cuvil_edge_app.py'"):
        check_run_app(_fab(entries))


def test_an_entry_twice_is_refused():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in installed_app_entries().items():
            z.writestr(name, data)
        with pytest.warns(UserWarning):
            z.writestr("cuvil_edge_app.py", b"print('second copy')")
    with pytest.raises(ForeignAppError, match="twice"):
        check_run_app(out.getvalue())


@pytest.mark.parametrize("fab", [b"", b"not a zip", b"PK\x03\x04" + b"\x00" * 40])
def test_garbage_is_refused(fab):
    with pytest.raises(ForeignAppError, match="not a readable FAB"):
        check_run_app(fab)


def test_an_oversized_bundle_is_refused_before_it_is_opened():
    with pytest.raises(ForeignAppError, match="a few KB"):
        check_run_app(b"\x00" * (MAX_FAB_BYTES + 1))


def test_a_zip_bomb_is_refused_before_it_is_unpacked():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("pyproject.toml", b"\x00" * (MAX_FAB_BYTES + 1))
    assert len(out.getvalue()) < 100_000
    with pytest.raises(ForeignAppError, match="unpacked"):
        check_run_app(out.getvalue())
