"""Shared fixtures: the real lab hosts (see tests/lab_fixtures.py); the folder a test
lives in says its kind. Shared doubles and builders: tests/doubles.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab_fixtures import lab_hosts
from tests.paths import TESTS

__all__ = ["lab_hosts"]

LAB = TESTS / "lab"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/lab/ needs lab hosts: it is marked ``lab`` by its folder,
    so ``-m "not lab and not vllm"`` selects exactly the tests under tests/unit/."""
    for item in items:
        if Path(item.path).resolve().is_relative_to(LAB):
            item.add_marker(pytest.mark.lab)


@pytest.fixture(autouse=True)
def _agent_records_hashes_in_a_scratch_file(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
) -> Iterator[None]:
    """The agent, called in-process, records the hashes of the role files it writes in
    /var/lib/vigil; a test on this machine records them in a scratch file instead."""
    from tests.agent_payload import agent

    monkeypatch.setattr(agent, "WRITTEN", str(tmp_path_factory.mktemp("agent-state") /
                                               "role-hashes.json"))
    yield
