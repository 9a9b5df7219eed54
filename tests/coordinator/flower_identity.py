"""A fixture shared by coordinator tests (not a conftest.py: a second module named conftest would shadow
tests/ir_serialize/conftest.py, which other tests import by name)."""

import pytest


@pytest.fixture
def flower_identity(monkeypatch):
    """Message() outside a Flower run raises "TaskIdentity.run_id is not set"; set its ids (a private API)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_node_id", "_task_id"):
        if hasattr(TaskIdentity, name):
            monkeypatch.setattr(TaskIdentity, name, 1)
